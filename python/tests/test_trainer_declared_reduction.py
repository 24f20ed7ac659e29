"""reduction= given for a loss memfit cannot read is checked by the loss's
values, not trusted: a token mean plus a sample mean declared "mean" trained
on gradients 0.65 relative off the whole batch's."""

import copy

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import GradientCapture as Capture
from test_trainer_masked_mean import B, T, V, TinyLM


def data():
    g = torch.Generator().manual_seed(1)
    ids, labels = torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)
    for i in range(B):
        labels[i, T - i % T:] = -100  # padding
    return ids, labels


def token_mean_plus_sample_mean(o, t):
    return F.cross_entropy(o.reshape(-1, V), t.reshape(-1)) + 0.01 * o.pow(2).mean()


def scaled_mean(o, t):
    return 0.5 * F.cross_entropy(o.reshape(-1, V), t.reshape(-1).clamp(min=0))


def split(loss_fn, **kw):
    model, (ids, labels) = TinyLM().double(), data()
    eager = copy.deepcopy(model)
    loss_fn(eager(ids), labels).backward()
    opt = Capture(model.parameters())
    memfit.Trainer(model, opt, loss_fn, micro_batch=3, **kw).step(ids, labels)
    return max((g - p.grad).abs().max().item() for g, p in zip(opt.grads, eager.parameters()))


def test_a_declared_mean_that_the_losss_values_contradict_is_refused():
    with pytest.raises(ValueError, match=r"^\[Trainer.step\] reduction='mean', but the loss is "
                                         r"not the mean of its samples' losses"):
        split(token_mean_plus_sample_mean, reduction="mean")
    # Undeclared, the refusal says reduction= cannot weight such a loss.
    with pytest.raises(ValueError, match=r"terms that average over different things \(tokens "
                                         r"and samples\) is neither"):
        split(token_mean_plus_sample_mean)


def test_a_declared_reduction_the_values_agree_with_splits_exactly():
    # float64, 35 terms regrouped: < 1e-13 (as test_trainer_masked_mean).
    assert split(scaled_mean, reduction="mean") < 1e-13
    with pytest.raises(ValueError, match=r"reduction='sum', but the loss is not the sum"):
        split(scaled_mean, reduction="sum")


def test_coupled_allow_splits_as_declared():
    # The user's word: each micro-batch weighted as a mean of samples.
    assert split(token_mean_plus_sample_mean, reduction="mean", coupled="allow") > 1e-2
