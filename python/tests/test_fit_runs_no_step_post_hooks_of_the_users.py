"""An EMA of the weights kept by an optimizer step post-hook: memfit's
rehearsals run the user's optimizer a dozen times and must not move it,
nor run a global post-hook (a step counter); both still run at the user's
next step, as without memfit. See Note [A rehearsal runs no step post-hooks
of the user's] (user_state.py)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook

import memfit


def _setup(two):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    params = list(model.parameters())
    opts = ([torch.optim.Adam(params[:2]), torch.optim.SGD(params[2:], lr=0.1)] if two
            else [torch.optim.Adam(params)])
    ema = copy.deepcopy(model).requires_grad_(False)

    def update_ema(*_):
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters()):
                e.lerp_(p, 0.5)
    opts[-1].register_step_post_hook(update_ema)
    return model, opts, ema


@pytest.mark.parametrize("how", ["cpu", "meta", "two optimizers", "profile"])
def test_a_rehearsal_leaves_an_ema_its_hook_keeps_and_the_hooks_run_after(how):
    model, opts, ema = _setup(how == "two optimizers")
    twin, twin_opts, twin_ema = _setup(how == "two optimizers")
    steps = []
    handle = register_optimizer_step_post_hook(lambda *_: steps.append(1))
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    try:
        optimizer = opts if len(opts) > 1 else opts[0]
        if how == "profile":
            memfit.profile(model, x, y, optimizer=optimizer)
        else:
            memfit.find_batch_size(model, x, y, optimizer=optimizer, budget=1 << 20,
                                   mode="meta" if how == "meta" else "cpu")
        assert not steps
        assert all(torch.equal(a, b) for a, b in zip(ema.parameters(), twin_ema.parameters()))
        # The user's next step, with and without memfit before it.
        for m, os in ((model, opts), (twin, twin_opts)):
            F.cross_entropy(m(x), y).backward()
            for o in os:
                o.step()
        assert len(steps) == 2 * len(opts)
    finally:
        handle.remove()
    assert all(torch.equal(a, b) for a, b in zip(ema.parameters(), twin_ema.parameters()))
