"""A loss computed by a module of its own (a perceptual loss over a frozen
feature network): its plain step holds that network's weights on the
device beside the model's, so a fit counts them, and a rehearsal leaves
them as they were. The truth is not memfit's: plain steps under
memfit.simulated_device at the budget."""

import gc

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import plain_steps_run

BUDGET = 16 << 20


class Perceptual(torch.nn.Module):
    """MSE between features of a frozen 256-2048-256 network: 4 MiB of
    weights that are not the model's, nor the optimizer's."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Linear(256, 2048), torch.nn.ReLU(),
                                            torch.nn.Linear(2048, 256)).requires_grad_(False)

    def forward(self, out, target):
        return F.mse_loss(self.features(out), self.features(target))


def _model():
    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 256))


def _batch(n):
    x = torch.randn(n, 256)
    return x, x.clone()


def _runs(b):
    def build():
        model = _model()
        return model, Perceptual(), torch.optim.Adam(model.parameters()), b

    def step(model, loss, opt, n):
        x, y = _batch(n)
        loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    return plain_steps_run(BUDGET, build, step, steps=3)


@pytest.mark.parametrize("bound", [False, True], ids=["module", "bound-forward"])
def test_a_loss_modules_frozen_weights_are_counted_and_the_answer_runs(bound):
    # Before: 509 samples, "verified"; plain steps ran out above 370.
    gc.collect()
    torch.manual_seed(0)
    model, loss = _model(), Perceptual()
    x, y = _batch(8)
    fit = memfit.find_batch_size(model, x, y, loss_fn=loss.forward if bound else loss,
                                 optimizer=torch.optim.Adam(model.parameters()), budget=BUDGET)
    assert fit.verified
    assert _runs(fit.max_batch), f"batch {fit.max_batch} ran out of memory"
    more = int(fit.max_batch * 1.05) + 1
    assert not _runs(more), f"batch {more} ran too: not tight"


@pytest.mark.parametrize("mode", [None, "meta"])
def test_a_rehearsal_leaves_the_loss_modules_weights_as_they_were(mode):
    torch.manual_seed(0)
    model, loss = _model(), Perceptual()
    weights = list(loss.parameters())
    values = [w.detach().clone() for w in weights]
    x, y = _batch(8)
    memfit.find_batch_size(model, x, y, loss_fn=loss, budget=BUDGET, mode=mode,
                           optimizer=torch.optim.Adam(model.parameters()))
    assert list(loss.parameters()) == weights
    assert all(not w.is_meta and torch.equal(w, v) for w, v in zip(weights, values))
    assert all(w.grad is None for w in weights)


def _teacher():
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 10)).requires_grad_(False)


def _student():
    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10))


def _distill(student, teacher, batch):
    x, y = batch
    with torch.no_grad():
        t = teacher(x)
    s = student(x)
    return F.cross_entropy(s, y) + F.kl_div(s.log_softmax(-1), t.softmax(-1),
                                            reduction="batchmean")


def _kd_runs(b):
    def build():
        student = _student()
        return _teacher(), student, torch.optim.Adam(student.parameters()), b

    def step(teacher, student, opt, n):
        _distill(student, teacher, (torch.randn(n, 256), torch.randint(0, 10, (n,)))).backward()
        opt.step()
        opt.zero_grad()

    return plain_steps_run(24 << 20, build, step, steps=3)


def test_a_teacher_read_by_the_step_function_is_counted_and_the_answer_runs():
    # Distillation with step=: the teacher (5 MiB, frozen) is in the step's
    # closure. Before: 2639 samples, "verified"; plain steps ran out above 2064.
    gc.collect()
    torch.manual_seed(0)
    teacher, student = _teacher(), _student()
    batch = (torch.randn(8, 256), torch.randint(0, 10, (8,)))
    fit = memfit.find_batch_size(student, batch, optimizer=torch.optim.Adam(student.parameters()),
                                 step=lambda m, b: _distill(m, teacher, b), budget=24 << 20)
    assert fit.verified
    assert _kd_runs(fit.max_batch), f"batch {fit.max_batch} ran out of memory"
    more = int(fit.max_batch * 1.05) + 1
    assert not _kd_runs(more), f"batch {more} ran too: not tight"
