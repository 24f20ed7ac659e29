"""An optimizer's scalar state that torch keeps on the host (NAdam's
mu_product, ASGD's eta and mu, beside every optimizer's step): a rehearsal
on meta tensors leaves it where it is, with its value, as it does "step".
Copied onto meta, a warm NAdam's step divided by a value meta does not
have (ZeroDivisionError). The truth is not memfit's: plain steps under
memfit.simulated_device at the budget."""

import copy

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import plain_steps_run

BUDGET = 4 << 20

OPTIMIZERS = {
    "nadam": lambda p: torch.optim.NAdam(p, decoupled_weight_decay=True, weight_decay=0.01),
    "asgd": lambda p: torch.optim.ASGD(p, t0=0),
}


def _model():
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10))


def _batch(n):
    return torch.randn(n, 64), torch.randint(0, 10, (n,))


def _warm(model, opt):
    x, y = _batch(16)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_warm_optimizers_host_scalars_rehearse_on_meta_and_the_answer_runs(name):
    make = OPTIMIZERS[name]
    torch.manual_seed(0)
    model = _model()
    opt = make(model.parameters())
    _warm(model, opt)
    state = copy.deepcopy(opt.state_dict())
    x, y = _batch(8)
    fit = memfit.find_batch_size(model, x, y, optimizer=opt, budget=BUDGET, mode="meta")
    after = opt.state_dict()
    for k, v in state["state"].items():
        for key, t in v.items():
            now = after["state"][k][key]
            assert torch.equal(t, now) and t.device == now.device

    def build():
        m = _model()
        o = make(m.parameters())
        _warm(m, o)
        return m, o, fit.max_batch

    def step(m, o, n):
        xb, yb = _batch(n)
        F.cross_entropy(m(xb), yb).backward()
        o.step()
        o.zero_grad()

    assert plain_steps_run(BUDGET, build, step, steps=3), f"batch {fit.max_batch} ran out"
