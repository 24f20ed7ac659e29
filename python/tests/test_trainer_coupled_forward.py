"""A model whose forward mixes the batch's samples is refused as a loss
that mixes them is: split, its gradients are not the whole batch's. See
Note [A forward that mixes the samples] (loss_weighting.py)."""

import copy

import pytest
import torch

import memfit
from memfit.testing.truth import GradientCapture as Capture

B, D, C = 8, 6, 4


class Centre(torch.nn.Module):
    """Each sample less the batch's mean: rows that depend on the others."""

    def forward(self, h):
        return h - h.mean(0, keepdim=True)


class AcrossTheBatch(torch.nn.Module):
    """Attention over the batch's dimension (a (B, E) input is one unbatched
    sequence of B tokens to MultiheadAttention)."""

    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(16, 2)

    def forward(self, h):
        return self.attn(h, h, h)[0]


def model(layer):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(D, 16), layer, torch.nn.Tanh(),
                               torch.nn.Linear(16, C)).double()


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(B, D, generator=g).double(), torch.randint(0, C, (B,), generator=g)


def split(m, x, y, **kw):
    opt = Capture(m.parameters())
    memfit.Trainer(m, opt, torch.nn.CrossEntropyLoss(), micro_batch=3, **kw).step(x, y)
    return opt.grads


def relative_error(got, m, x, y):
    """Against the plain step on the whole batch."""
    plain = copy.deepcopy(m)
    torch.nn.functional.cross_entropy(plain(x), y).backward()
    return max(float((g - p.grad).norm() / p.grad.norm())
               for g, p in zip(got, plain.parameters()))


@pytest.mark.parametrize("layer", [Centre, AcrossTheBatch])
def test_a_forward_that_mixes_the_samples_is_refused_unless_allowed(layer):
    m, (x, y) = model(layer()), batch()
    with pytest.raises(ValueError, match=r"^\[Trainer.step\] the model's forward mixes the "
                                         r"batch's samples .*coupled='allow'"):
        split(copy.deepcopy(m), x, y)
    # The truth that makes it a refusal: split anyway, the gradients are far
    # from the plain step's (they went through silently, 0.94-1.26 off).
    assert relative_error(split(copy.deepcopy(m), x, y, coupled="allow"), m, x, y) > 0.1


def test_a_forward_that_keeps_the_samples_apart_is_split_as_before():
    m, (x, y) = model(torch.nn.GroupNorm(4, 16)), batch()
    # Float64, 8 samples added in another order: a few ulps.
    assert relative_error(split(copy.deepcopy(m), x, y), m, x, y) < 1e-13
