"""A loss that mixes the batch's samples before it reduces them is refused
when the Trainer would split the batch, as BatchNorm is: split, each
micro-batch's loss would see only its own samples and the gradients would
not be the whole batch's (Note [Probing how the loss reduces])."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import GradientCapture as Capture


def contrastive(out, target):
    """In-batch negatives: each sample against every other of the batch."""
    z = F.normalize(out, dim=1)
    return F.cross_entropy(z @ z.T / 0.1, torch.arange(len(out)))


def batch_spread(out, target):
    return out.std(0).mean()


def per_sample(out, target):
    return F.cross_entropy(out, target, label_smoothing=0.1)


def model_and_batch():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 10)).double()
    return model, torch.randn(32, 16, dtype=torch.float64), torch.randint(0, 10, (32,))


def trained_grads(loss_fn, **kwargs):
    """The gradients the Trainer's step handed the optimizer, and the eager
    step's on the whole batch."""
    model, x, y = model_and_batch()
    eager = copy.deepcopy(model)
    loss_fn(eager(x), y).backward()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    seen = {}
    real = opt.step
    opt.step = lambda *a, **k: (seen.setdefault("g", [p.grad.clone() for p in model.parameters()]),
                                real(*a, **k))[1]
    memfit.Trainer(model, opt, loss_fn=loss_fn, micro_batch=8, **kwargs).step(x, y)
    return seen["g"], [p.grad for p in eager.parameters()]


@pytest.mark.parametrize("loss_fn", [contrastive, batch_spread])
def test_a_loss_that_mixes_samples_is_refused_when_the_batch_is_split(loss_fn):
    with pytest.raises(ValueError, match=r"^\[Trainer.step\] the loss mixes the batch's samples "
                                         r".*coupled='allow'"):
        trained_grads(loss_fn)


def test_coupled_allow_splits_anyway_and_the_gradients_are_each_micro_batchs():
    got, eager = trained_grads(contrastive, coupled="allow")
    # Not the whole batch's: the reason it is refused by default.
    assert not all(torch.allclose(g, e) for g, e in zip(got, eager))


def test_a_per_sample_loss_splits_to_the_whole_batchs_gradients():
    got, eager = trained_grads(per_sample)
    # float64 throughout: four micro-batches summed against one batch differ
    # by summation order only, ~1e-16 relative.
    for g, e in zip(got, eager):
        assert torch.allclose(g, e, rtol=1e-12, atol=1e-14)


# -- a loss made inside the step: the step itself is run again --------------------------


def clip_step(model, batch):
    """A CLIP-style step: each sample's two views against every other's."""
    a, b = batch
    za, zb = F.normalize(model(a), dim=1), F.normalize(model(b), dim=1)
    return F.cross_entropy(za @ zb.T / 0.1, torch.arange(len(a)))


def step_grads(step, batch, micro_batch=8, **kwargs):
    """The gradients the Trainer's step handed the optimizer, the eager
    step's on the whole batch, and the Trainer's report."""
    model, _, _ = model_and_batch()
    eager = copy.deepcopy(model)
    step(eager, batch).backward()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    seen = {}
    real = opt.step
    opt.step = lambda *a, **k: (seen.setdefault("g", [p.grad.clone() for p in model.parameters()]),
                                real(*a, **k))[1]
    r = memfit.Trainer(model, opt, step=step, micro_batch=micro_batch, **kwargs).step(batch)
    return seen["g"], [p.grad for p in eager.parameters()], r


def two_views():
    g = torch.Generator().manual_seed(3)
    return (torch.randn(32, 16, dtype=torch.float64, generator=g),
            torch.randn(32, 16, dtype=torch.float64, generator=g))


def test_a_step_function_whose_loss_mixes_samples_is_refused_when_the_batch_is_split():
    # Split, it trained on gradients 90% off the whole batch's, saying nothing.
    with pytest.raises(ValueError, match=r"^\[Trainer.step\] the loss mixes the batch's samples "
                                         r".*coupled='allow'") as e:
        step_grads(clip_step, two_views())
    assert "\n" not in str(e.value)
    got, eager, r = step_grads(clip_step, two_views(), coupled="allow")
    assert r.micro_batches == 4
    assert not all(torch.allclose(g, w) for g, w in zip(got, eager))


class Counted(torch.nn.Module):
    """Dropout, and a buffer each training forward writes (as a queue of
    negatives is written): the check's own runs must change neither."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 10).double()
        self.drop = torch.nn.Dropout(0.5)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        if self.training:
            self.calls += 1
        return self.lin(self.drop(x))


def test_a_per_sample_step_splits_and_the_checks_runs_leave_no_trace():
    torch.manual_seed(0)
    model = Counted()
    x, y = two_views()[0], torch.randint(0, 10, (32,))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)

    def step(m, batch):
        return F.cross_entropy(m(batch[0]), batch[1])

    rng = torch.get_rng_state()
    r = memfit.Trainer(model, opt, step=step, micro_batch=8).step((x, y))
    assert r.micro_batches == 4
    # One training forward per micro-batch: the check ran the step 9 times more, in eval mode.
    assert model.calls.item() == 4
    assert model.training and model.drop.training
    # The RNG moved by four micro-batches' dropout masks and nothing else:
    # the check's runs (eval mode, the RNG put back) drew none of the user's.
    after = torch.get_rng_state()
    torch.set_rng_state(rng)
    for i in range(4):
        F.dropout(x[8 * i:8 * i + 8], 0.5)
    assert torch.equal(torch.get_rng_state(), after)


def test_a_per_sample_step_split_gives_the_whole_batchs_gradients():
    def step(m, batch):
        return F.cross_entropy(m(batch[0]), batch[1])

    x = two_views()[0]
    y = torch.randint(0, 10, (32,), generator=torch.Generator().manual_seed(4))
    got, eager, r = step_grads(step, (x, y))
    assert r.micro_batches == 4
    # float64 throughout: four micro-batches summed against one batch differ
    # by summation order only, ~1e-16 relative.
    for g, e in zip(got, eager):
        assert torch.allclose(g, e, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("how", ["loss_fn", "step"])
def test_a_loss_that_mixes_samples_is_refused_in_micro_batches_of_one(how):
    # One sample's output cannot show the mixing: the step is run again on 8
    # of the batch's samples. Split so, each sample's contrastive loss alone
    # is 0 and the gradients were 1.27 off the whole batch's, saying nothing.
    model, x, y = model_and_batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    if how == "loss_fn":
        trainer, batch = memfit.Trainer(model, opt, loss_fn=contrastive, micro_batch=1), (x, y)
    else:
        trainer = memfit.Trainer(model, opt, step=lambda m, b: contrastive(m(b[0]), b[1]),
                                 micro_batch=1)
        batch = ((x, y),)
    with pytest.raises(ValueError, match=r"^\[Trainer.step\] the loss mixes the batch's samples "
                                         r"before it reduces them \(on 8 samples together"):
        trainer.step(*batch)


def test_a_loss_that_is_nan_is_not_called_mixing_and_the_next_step_is_checked():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 4)).double()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 6, generator=g).double(), torch.randn(8, 4, generator=g).double()

    def centred(o, t):
        """Each output less the batch's mean: it mixes the samples."""
        return ((o - o.mean(0, keepdim=True) - t) ** 2).mean()

    bad = torch.full_like(x, float("nan"))  # a batch that went bad upstream
    plain = copy.deepcopy(model)
    centred(plain(bad), y).backward()
    trainer = memfit.Trainer(model, Capture(model.parameters()), centred, micro_batch=3)
    # The plain step's loss and gradients are NaN: that is no sign of a
    # loss mixing the samples (it was refused as one, nan against nan).
    assert math.isnan(trainer.step(bad, y).loss)
    assert all(p.grad.isnan().any() for p in plain.parameters())
    with pytest.raises(ValueError, match=r"^\[Trainer.step\] the loss mixes the batch's samples "):
        trainer.step(x, y)
