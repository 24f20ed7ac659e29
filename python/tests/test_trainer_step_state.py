"""What a split step's forward does besides the loss (random draws, buffer
writes): put back when a micro-batch is redone after an OOM, and named in
the report where one eager step on the whole batch would differ."""

import copy

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import GradientCapture as Capture

B = 8


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(B, 13, generator=g).double(), torch.randint(0, 3, (B,), generator=g)


def dropout_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(13, 13), torch.nn.Dropout(0.5),
                               torch.nn.Linear(13, 3)).double()


def eager(model, x, y, seed):
    """The plain step on the whole batch: its gradients and the RNG after it."""
    model = copy.deepcopy(model)
    torch.manual_seed(seed)
    F.cross_entropy(model(x), y).backward()
    return [p.grad for p in model.parameters()], torch.get_rng_state()


def split_step(model, x, y, seed, fail_after=0, micro_batch=3, **kw):
    model = copy.deepcopy(model)
    opt = Capture(model.parameters())
    trainer = memfit.Trainer(model, opt, torch.nn.CrossEntropyLoss(), micro_batch=micro_batch,
                             **kw)
    torch.manual_seed(seed)
    with memfit.track():
        memfit._memfit.fail_allocation_after(fail_after)
        try:
            report = trainer.step(x, y)
        finally:
            memfit._memfit.fail_allocation_after(0)
    return opt.grads, torch.get_rng_state(), report, model


def test_a_micro_batch_redone_after_an_oom_draws_what_the_eager_step_draws():
    # On the CPU dropout draws its masks element by element, so micro-batches
    # draw the whole batch's masks: the eager step is the truth, in float64
    # up to summation order (B = 8 terms of |g| <= 1: 1e-14 is 40 ulps).
    # A redo drew on from where its failed attempt stopped: 0.54 off.
    model, (x, y) = dropout_model(), data()
    want, rng_after = eager(model, x, y, seed=3)
    for k in (2, 5, 9, 14):  # each a failure in another phase of a micro-batch
        grads, rng, report, _ = split_step(model, x, y, seed=3, fail_after=k)
        assert report.ooms_recovered == 1 and sum(report.chunks) == B, k
        assert max((g - w).abs().max().item() for g, w in zip(grads, want)) < 1e-14, k
        assert torch.equal(rng, rng_after), k


def test_a_step_that_raises_puts_the_rng_back():
    model, (x, y) = dropout_model(), data()

    def loss_fn(out, target):
        if torch.is_grad_enabled() and len(out) == 2:  # the last micro-batch's
            raise RuntimeError("the user's loss failed")
        return F.cross_entropy(out, target)

    trainer = memfit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn,
                             micro_batch=3)
    torch.manual_seed(3)
    before = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="the user's loss failed"):
        trainer.step(x, y)
    assert torch.equal(torch.get_rng_state(), before)


class Noisy(torch.nn.Module):
    """Noise drawn with torch.randn_like: no dropout layer to name."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(13, 3)

    def forward(self, x):
        return self.layer(x + 0.1 * torch.randn_like(x))


def test_random_numbers_drawn_outside_a_dropout_layer_are_named_in_a_split_step():
    torch.manual_seed(0)
    model, (x, y) = Noisy().double(), data()
    want, _ = eager(model, x, y, seed=3)
    grads, _, report, _ = split_step(model, x, y, seed=3)
    # torch.randn draws in blocks of 16: each micro-batch's noise is not
    # its slice of the whole batch's.
    assert max((g - w).abs().max().item() for g, w in zip(grads, want)) > 1e-3
    assert len(report.notes) == 1
    assert report.notes[0].startswith("the step drew random numbers per micro-batch (3 of them")
    # Whole, nothing to say.
    assert split_step(model, x, y, seed=3, micro_batch=0)[2].notes == []


class Tracking(torch.nn.Module):
    """A forward that counts its calls and divides by an EMA of its inputs."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(13, 3)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.register_buffer("scale", torch.ones(13, dtype=torch.float64))

    def forward(self, x):
        with torch.no_grad():
            self.calls += 1
            self.scale.mul_(0.5).add_(0.5 * x.abs().mean(0))
        return self.layer(x / self.scale)


def test_buffers_a_split_steps_forward_writes_are_named_with_what_to_do():
    torch.manual_seed(0)
    model, (x, y) = Tracking().double(), data()
    want, _ = eager(model, x, y, seed=3)
    grads, _, report, stepped = split_step(model, x, y, seed=3)
    # Each micro-batch read the scale the ones before it wrote: 0.12 off.
    assert max((g - w).abs().max().item() for g, w in zip(grads, want)) > 1e-2
    assert stepped.calls.item() == 3
    assert len(report.notes) == 1
    note = report.notes[0]
    assert note.startswith("the forward wrote buffers in each of the 3 micro-batches")
    assert "buffers: calls, scale." in note and "run the batch whole" in note
    assert split_step(model, x, y, seed=3, micro_batch=0)[2].notes == []
    model.eval()
    assert split_step(model, x, y, seed=3)[2].notes == []


def test_batchnorm_split_under_coupled_allow_is_named_once_in_the_notes():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(13, 6), torch.nn.BatchNorm1d(6),
                                torch.nn.Linear(6, 3)).double()
    x, y = data()
    report = split_step(model, x, y, seed=3, coupled="allow")[2]
    assert len(report.notes) == 1  # its running statistics are not named twice
    assert report.notes[0].startswith("BatchNorm normalised each of the 3 micro-batches by its "
                                      "own statistics (coupled='allow')")
    assert "layers: 1." in report.notes[0]
