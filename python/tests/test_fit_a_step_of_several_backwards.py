"""A loop that runs one backward per loss, the graph kept for the next
(l1.backward(retain_graph=True); l2.backward()), holds more than the
backward of their sum: given step= returning l1 + l2, find_batch_size
answered above what that loop runs. A step may return the losses as a
tuple: their backwards run in turn, as the loop runs them. See Note [A step
of several backwards] (user_step.py). The truth: plain steps of that loop."""

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import largest_that_fits, plain_steps_run

BUDGET = 8 << 20


def _build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    return model, torch.optim.Adam(model.parameters())


def _data(b):
    return torch.randn(b, 128), torch.randint(0, 10, (b,))


def _step(model, batch):
    x, y = batch
    out = model(x)
    return F.cross_entropy(out, y), 0.1 * out.pow(2).mean()


def _two_backwards(model, opt, b):
    first, second = _step(model, _data(b))
    first.backward(retain_graph=True)
    second.backward()
    opt.step()
    opt.zero_grad()


def _runs(b):
    return plain_steps_run(BUDGET, lambda: (*_build(), b), _two_backwards, steps=3)


def test_a_step_returning_its_losses_is_fitted_as_their_backwards_in_turn():
    model, opt = _build()
    fit = memfit.find_batch_size(model, _data(8), optimizer=opt, budget=BUDGET, step=_step)
    truth = largest_that_fits(_runs, fit.max_batch)
    assert fit.verified and 0.95 * truth <= fit.max_batch <= truth, (fit.max_batch, truth)


def test_the_trainer_takes_the_sum_of_a_steps_losses():
    model, opt = _build()
    twin, twin_opt = _build()
    batch = _data(16)
    memfit.Trainer(model, opt, step=_step, plan=False).step(batch)
    # The plain loop, on the same batch (its gradients summed in another order).
    first, second = _step(twin, batch)
    first.backward(retain_graph=True)
    second.backward()
    twin_opt.step()
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(model.parameters(),
                                                                twin.parameters()))


def test_a_loss_beside_a_metric_is_refused_in_one_line():
    model, opt = _build()

    def step(model, batch):
        x, y = batch
        out = model(x)
        return F.cross_entropy(out, y), (out.argmax(1) == y).float().mean()
    with pytest.raises(ValueError, match=r"^\[find_batch_size\] the step returned tuple"):
        memfit.find_batch_size(model, _data(8), optimizer=opt, budget=BUDGET, step=step)
