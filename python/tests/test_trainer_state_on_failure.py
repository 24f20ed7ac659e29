"""A Trainer step that fails leaves the optimizer as it was: a parameter's
state made by that step (Adam's exp_avg without its exp_avg_sq, when the
step ran out of memory between them) goes with it, and a later step, with
more room, is the plain step from the same start; one that fails after
writing the state it held says so."""

import copy
import sys

import pytest
import torch

import memfit


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 10)).double()


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(64, 256, generator=g, dtype=torch.float64), \
        torch.randint(0, 10, (64,), generator=g)


def test_an_optimizer_step_that_runs_out_leaves_no_half_made_state_and_the_next_step_is_plain():
    model = net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = batch()
    # Adam's state is twice the weights (2 MiB each): exp_avg fits in 8 MiB,
    # exp_avg_sq then does not. A smaller batch cannot help.
    small = memfit.Trainer(model, opt, loss_fn=torch.nn.functional.cross_entropy,
                           budget="8MiB")
    with pytest.warns(RuntimeWarning), pytest.raises(torch.OutOfMemoryError,
                                                     match="optimizer step"):
        small.step(x, y)
    assert len(opt.state) == 0
    assert all(p.grad is None for p in model.parameters())

    roomy = memfit.Trainer(model, opt, loss_fn=torch.nn.functional.cross_entropy,
                           budget="64MiB")
    roomy.step(x, y)  # raised KeyError: 'exp_avg_sq' on the half-made state

    plain = net()
    plain_opt = torch.optim.Adam(plain.parameters(), lr=1e-2)
    torch.nn.functional.cross_entropy(plain(x), y).backward()
    plain_opt.step()
    for a, b in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)  # float64: the same step


def test_an_optimizer_step_that_fails_after_writing_the_held_state_says_so():
    # See Note [An optimizer step that fails part way] (step_guard.py).
    model = net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = batch()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()  # the state a resumed run holds
    opt.zero_grad()
    before = copy.deepcopy(opt.state_dict()["state"])
    trainer = memfit.Trainer(model, opt, loss_fn=torch.nn.functional.cross_entropy,
                             budget="8MiB", plan=False)
    with pytest.raises(torch.OutOfMemoryError, match="optimizer step") as failed:
        trainer.step(x, y)
    # The truth: the state after the failure against a copy from before it
    # (Adam advanced the first weight's step, exp_avg and exp_avg_sq, then
    # ran out on its denominator). It was said nowhere.
    after = opt.state_dict()["state"]
    written = sum(not torch.equal(before[i][k], after[i][k]) for i in before for k in before[i])
    assert written > 0
    notes = " ".join(getattr(failed.value, "__notes__", []))
    if sys.version_info >= (3, 11):
        assert f"and {written} of its state tensor(s) in place" in notes
