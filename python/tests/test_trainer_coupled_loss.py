"""A loss that mixes the batch's samples before it reduces them is refused
when the Trainer would split the batch, as BatchNorm is: split, each
micro-batch's loss would see only its own samples and the gradients would
not be the whole batch's (Note [Probing how the loss reduces])."""

import copy

import pytest
import torch
import torch.nn.functional as F

import memfit


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
