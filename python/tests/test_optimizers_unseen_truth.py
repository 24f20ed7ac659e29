"""Optimizers memfit has no built-in name for (RMSprop centered with
momentum: three buffers; Rprop: two and a step size; Adagrad: one;
torch.optim.Adafactor: factored rows and columns), each warm (state held
from a step before the call): find_batch_size's answer against the truth
that is not memfit's, plain steps of the loop under memfit.simulated_device
at the budget, and the optimizer's state after the call bit for bit as it
was."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memfit
from memfit.testing.truth import largest_that_fits, plain_steps_run

BUDGET = 6 << 20

OPTIMIZERS = {
    "rmsprop_centered": lambda p: torch.optim.RMSprop(p, momentum=0.9, centered=True),
    "rprop": lambda p: torch.optim.Rprop(p),
    "adagrad": lambda p: torch.optim.Adagrad(p),
    "adafactor": lambda p: torch.optim.Adafactor(p),
}


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def _batch(n):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)


def _warm(name):
    model = _net()
    opt = OPTIMIZERS[name](model.parameters())
    x, y = _batch(16)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def _loop_step(model, opt, x, y, kept):  # PyTorch's quickstart body: pred kept
    kept["pred"] = model(x)
    kept["loss"] = F.cross_entropy(kept["pred"], y)
    kept["loss"].backward()
    opt.step()
    opt.zero_grad()


def _assert_same_state(before, after):
    assert before.keys() == after.keys()
    for k, v in before.items():
        for key, t in v.items():
            now = after[k][key]
            if isinstance(t, torch.Tensor):
                assert torch.equal(t, now) and t.device == now.device, (k, key)
            else:
                assert t == now, (k, key)


@pytest.mark.parametrize("mode", ["cpu", "meta"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_warm_unseen_optimizers_fit_is_the_plain_loops_and_leaves_its_state(name, mode):
    model, opt = _warm(name)
    state = copy.deepcopy(opt.state_dict())
    fit = memfit.find_batch_size(model, *_batch(8), optimizer=opt, budget=BUDGET, mode=mode)
    _assert_same_state(state["state"], opt.state_dict()["state"])
    assert opt.state_dict()["param_groups"] == state["param_groups"]

    def fits(n):
        xs, ys = _batch(n)
        return plain_steps_run(BUDGET, lambda: _warm(name) + ({},),
                               lambda m, o, kept: _loop_step(m, o, xs.clone(), ys.clone(), kept))

    true_max = largest_that_fits(fits, fit.max_batch)
    assert fit.max_batch <= true_max
    # Measured exact on these fp32 linears (each optimizer's state and
    # temporaries are sized, not modelled); 2% leaves room for a CPU whose
    # kernels take a little scratch at some batches.
    assert fit.max_batch >= 0.98 * true_max, (fit.max_batch, true_max)
