"""A loss with weights of its own (an ArcFace-style margin head), trained by
the model's optimizer: its plain step holds those weights on the device and
its optimizer.step() updates them. A fit counts them, and a rehearsal runs
on copies of them: the user's weights are left as they were. The truth is
not memfit's: plain steps under memfit.simulated_device at the budget."""

import gc

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import plain_steps_run

BUDGET = 24 << 20
CLASSES = 8192


class Margin(torch.nn.Module):
    """A cosine classifier over 8192 classes: 2 MiB of weights, not the model's."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(CLASSES, 64) * 0.01)

    def forward(self, emb, y):
        return F.cross_entropy(F.normalize(emb) @ F.normalize(self.w).t() * 30, y)


def _model():
    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 64))


def _batch(n):
    return torch.randn(n, 256), torch.randint(0, CLASSES, (n,))


def _made():
    model, loss = _model(), Margin()
    return model, loss, torch.optim.Adam([*model.parameters(), *loss.parameters()])


def _runs(b):
    def step(model, loss, opt, n):
        x, y = _batch(n)
        loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    return plain_steps_run(BUDGET, lambda: (*_made(), b), step, steps=3)


def test_a_loss_modules_weights_in_the_optimizer_are_counted_and_the_answer_runs():
    # Before: 176 samples, "verified"; plain steps ran out of memory above 155.
    gc.collect()
    torch.manual_seed(0)
    model, loss, opt = _made()
    x, y = _batch(8)
    fit = memfit.find_batch_size(model, x, y, loss_fn=loss, optimizer=opt, budget=BUDGET)
    assert fit.verified
    assert _runs(fit.max_batch), f"batch {fit.max_batch} ran out of memory"
    more = int(fit.max_batch * 1.05) + 1
    assert not _runs(more), f"batch {more} ran too: not tight"


@pytest.mark.parametrize("mode", [None, "meta"])
def test_a_rehearsal_leaves_the_loss_modules_weights_as_they_were(mode):
    # Before, the rehearsal's optimizer.step() updated the user's own
    # margin weights (a step the user never took).
    torch.manual_seed(0)
    model, loss, opt = _made()
    w, before = loss.w, loss.w.detach().clone()
    x, y = _batch(8)
    memfit.find_batch_size(model, x, y, loss_fn=loss, optimizer=opt, budget=BUDGET, mode=mode)
    assert loss.w is w and torch.equal(w, before) and w.grad is None and not opt.state
    memfit.profile(model, x, y, loss_fn=loss, optimizer=opt, mode=mode)
    assert torch.equal(w, before) and w.grad is None and not opt.state
