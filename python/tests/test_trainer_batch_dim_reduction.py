"""A loss that reduces the samples by a reduction over the batch's
dimension (l.mean(0).sum(): a per-output mean, summed) is weighted as that
reduction, not as the full one after it. See Note [A reduction over the
batch's dimension] (loss_weighting.py)."""

import copy

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import GradientCapture as Capture

B, D, K = 8, 6, 4


def per_output_mean(o, t):
    return F.mse_loss(o, t, reduction="none").mean(0).sum()


def per_output_sum(o, t):
    return F.mse_loss(o, t, reduction="none").sum(0).mean()


@pytest.mark.parametrize("loss_fn", [per_output_mean, per_output_sum])
@pytest.mark.parametrize("coupled", ["error", "allow"])
def test_a_loss_reduced_over_the_batch_dimension_gives_the_whole_batchs_gradients(
        loss_fn, coupled):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(B, D, generator=g).double(), torch.randn(B, K, generator=g).double()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(D, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, K)).double()
    plain = copy.deepcopy(model)
    loss_fn(plain(x), y).backward()
    opt = Capture(model.parameters())
    report = memfit.Trainer(model, opt, loss_fn, micro_batch=3, coupled=coupled).step(x, y)
    assert report.chunks == [3, 3, 2]
    # Refused as mixing the samples (coupled="error"), or weighted by the
    # full reduction's rule (coupled="allow": 3x or 1/3 of the gradients).
    # Float64, 8 samples added in another order: a few ulps.
    for got, p in zip(opt.grads, plain.parameters()):
        torch.testing.assert_close(got, p.grad, rtol=1e-13, atol=1e-15)
