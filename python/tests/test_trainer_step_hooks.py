"""The first step under a budget plans its micro-batch by running the
user's optimizer on copies: an EMA a step post-hook keeps moves once, as
after the plain step. See Note [A rehearsal runs no step post-hooks of the
user's] (_step/user_state.py)."""

import copy
import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

B, D, H, C = 256, 64, 256, 5
MiB = 2**20


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(D, H), torch.nn.Tanh(), torch.nn.Linear(H, H),
                               torch.nn.Tanh(), torch.nn.Linear(H, C)).double()


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(B, D, generator=g).double(), torch.randint(0, C, (B,), generator=g)


def with_ema(model, opt):
    """An EMA of the weights, kept by a step post-hook, and its calls."""
    ema, calls = copy.deepcopy(model), []

    def update(_opt, _args, _kwargs):
        calls.append(1)
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters()):
                e.mul_(0.9).add_(p, alpha=0.1)

    opt.register_step_post_hook(update)
    return ema, calls


def plain_step():
    model = net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ema, _ = with_ema(model, opt)
    x, y = batch()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    return ema


@pytest.mark.parametrize("budget_mib, chunks", [(16, 1), (4, 2)])
def test_the_plan_leaves_an_ema_kept_by_a_step_hook_as_the_plain_step_does(budget_mib, chunks):
    want = plain_step()
    model = net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ema, calls = with_ema(model, opt)
    x, y = batch()
    gc.collect()
    trainer = memfit.Trainer(model, opt, torch.nn.CrossEntropyLoss(),
                             budget=budget_mib * MiB + tracked_live_bytes("cpu"))
    report = trainer.step(x, y)
    assert trainer.planned is not None and len(report.chunks) >= chunks
    # The plan's probes ran the hook 11 (whole) or 23 (split) times; the step
    # runs it once. Float64: micro-batches add the gradients in another
    # order (a few ulps), which Adam's first step passes on as m / sqrt(v).
    assert len(calls) == 1
    for e, w in zip(ema.parameters(), want.parameters()):
        torch.testing.assert_close(e, w, rtol=1e-12, atol=1e-12)
