"""optimizer=[o1, o2]: a loop that steps two optimizers over different
parameters (Muon for the matrices and AdamW for the rest, in today's LLM
training) is measured with both, checked against plain steps of that loop.
See Note [Several optimizers in one step] (optimizer_chain.py)."""

import gc

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memfit
from memfit._native import tracked_live_bytes
from memfit.testing.truth import largest_that_fits, plain_steps_run

BUDGET = 12 << 20


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))


def _two(model):
    """SGD with momentum (one buffer) over the matrices, AdamW (two) over the biases."""
    matrices = [p for p in model.parameters() if p.dim() == 2]
    rest = [p for p in model.parameters() if p.dim() != 2]
    return [torch.optim.SGD(matrices, lr=0.1, momentum=0.9), torch.optim.AdamW(rest)]


def _batch(n):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 256, generator=g), torch.randint(0, 10, (n,), generator=g)


def _loop_step(model, optimizers, x, y):  # the user's loop
    F.cross_entropy(model(x), y).backward()
    for o in optimizers:
        o.step()
    for o in optimizers:
        o.zero_grad(set_to_none=True)


def test_the_fit_with_two_optimizers_runs_their_loop_and_leaves_them_as_they_were():
    gc.collect()
    left = tracked_live_bytes("cpu")
    x, y = _batch(8)
    with memfit.simulated_device(BUDGET + left):
        model = _net()
        opts = _two(model)
        lrs = [g["lr"] for o in opts for g in o.param_groups]
        fit = memfit.find_batch_size(model, x, y, optimizer=opts)
        alike = memfit.find_batch_size(model, x, y, optimizer=torch.optim.AdamW(
            model.parameters()))
        assert all(not o.state for o in opts)
        assert [g["lr"] for o in opts for g in o.param_groups] == lrs
        del model, opts
    assert fit.verified

    def fits(n):
        xs, ys = _batch(n)

        def build():
            m = _net()
            return m, _two(m)
        return plain_steps_run(BUDGET, build, lambda m, o: _loop_step(m, o, xs.clone(),
                                                                     ys.clone()))

    true_max = largest_that_fits(fits, fit.max_batch)
    assert fit.max_batch <= true_max
    assert fit.max_batch >= 0.97 * true_max, (fit.max_batch, true_max)
    # One AdamW over everything keeps a second buffer for each matrix too:
    # a safe stand-in, but it leaves room unused.
    assert alike.max_batch < fit.max_batch


def test_the_report_names_both_optimizers_and_counts_both_states():
    model = _net()
    opts = _two(model)
    report = memfit.profile(model, *_batch(8), optimizer=opts, mode="cpu")
    sgd_only = memfit.profile(model, *_batch(8), optimizer=opts[0], mode="cpu")
    assert report.optimizer == "SGD+AdamW"
    rest = [p for p in model.parameters() if p.dim() != 2]
    state = [r.categories_at_peak["optimizer_state"] for r in (report, sgd_only)]
    # AdamW's two buffers and its step count (a 4-byte tensor) for each of
    # the biases, on top of SGD's momentum over the matrices.
    assert state[0] - state[1] == sum(2 * p.numel() * 4 + 4 for p in rest)


def test_the_trainer_steps_both_as_the_users_loop_does():
    torch.set_default_dtype(torch.float64)  # equal to the loop's bits, summed in float64
    try:
        model, twin = _net(), _net()
        x, y = _batch(64)
        trainer = memfit.Trainer(model, _two(model), F.cross_entropy, micro_batch=16)
        mine = _two(twin)
        for _ in range(2):
            trainer.step(x, y)
            _loop_step(twin, mine, x, y)
        for a, b in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    finally:
        torch.set_default_dtype(torch.float32)


def test_a_parameter_in_two_optimizers_is_refused_in_one_line():
    model = _net()
    both = [torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.AdamW(model.parameters())]
    with pytest.raises(ValueError, match=r"optimizers 0 and 1 of the list both hold a parameter "
                                         r"of shape \(1024, 256\)"):
        memfit.profile(model, *_batch(4), optimizer=both)


def test_advise_takes_one_optimizer_and_says_what_to_pass():
    model = _net()
    with pytest.raises(ValueError, match=r"^\[advise\] optimizer is a list of 2 optimizers: "
                                         r".*profile, find_batch_size and the Trainer take"):
        memfit.advise(model, *_batch(4), optimizer=_two(model), repeats=1)
