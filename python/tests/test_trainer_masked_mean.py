"""A loss averaged over the batch's tokens, not its samples (a padding mask's
sum, a masked select's mean): split, each micro-batch weighs by its tokens."""

import copy

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import GradientCapture as Capture

B, T, V = 7, 5, 11


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(V, 6)
        self.out = torch.nn.Linear(6, V)

    def forward(self, ids):
        return self.out(torch.tanh(self.emb(ids)))


def data(masked_from=B):
    """Token ids, labels, and a mask of sample i's last i % T tokens (the
    samples from `masked_from` on wholly masked)."""
    g = torch.Generator().manual_seed(1)
    ids, labels = torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.float64)
    for i in range(B):
        mask[i, T - i % T:] = 0
    mask[masked_from:] = 0
    return ids, (labels, mask)


def per_token(out, labels):
    return F.cross_entropy(out.transpose(1, 2), labels, reduction="none")


LOSSES = {
    "sum over mask.sum()": lambda o, t: (per_token(o, t[0]) * t[1]).sum() / t[1].sum(),
    "clamped count": lambda o, t: (per_token(o, t[0]) * t[1]).sum() / t[1].sum().clamp(min=1),
    "masked select's mean": lambda o, t: per_token(o, t[0])[t[1].bool()].mean(),
    "token weights": lambda o, t: (per_token(o, t[0]) * t[1] * (1 + t[0] % 2)).sum()
    / (t[1] * (1 + t[0] % 2)).sum(),
}


def eager_gradients(model, ids, target, loss_fn):
    model = copy.deepcopy(model)
    loss_fn(model(ids), target).backward()
    return [p.grad for p in model.parameters()]


def split_gradients(model, ids, target, loss_fn, fail_after=0, **kw):
    model = copy.deepcopy(model)
    opt = Capture(model.parameters())
    trainer = memfit.Trainer(model, opt, loss_fn, micro_batch=3, **kw)
    with memfit.track():
        memfit._memfit.fail_allocation_after(fail_after)
        try:
            report = trainer.step(ids, target)
        finally:
            memfit._memfit.fail_allocation_after(0)
    return opt.grads, report


def max_difference(got, want):
    return max((g - w).abs().max().item() for g, w in zip(got, want))


# float64: the split regroups each gradient's sum over B * T = 35 tokens, of
# terms below 1 here: |split - whole| <= 36 * 2**-53 * 35 < 1.5e-13.
TOLERANCE = 1.5e-13


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("masked_from", [B, 3])  # 3: the last micro-batches have no tokens
@pytest.mark.parametrize("coupled", ["error", "allow"])  # allow: the loss's check skipped
def test_a_token_mean_split_gives_the_whole_batchs_gradients(name, masked_from, coupled):
    model, (ids, target) = TinyLM().double(), data(masked_from)
    want = eager_gradients(model, ids, target, LOSSES[name])
    got, report = split_gradients(model, ids, target, LOSSES[name], coupled=coupled)
    assert list(report.chunks) == [3, 2, 2]
    # Weighted by samples it was 0.06 (0.65 relative) off, or refused as a
    # loss neither mean nor sum (a select's mean: as mixing the samples).
    assert max_difference(got, want) < TOLERANCE


def test_an_oom_redone_token_mean_stays_exact():
    loss_fn = LOSSES["sum over mask.sum()"]
    model, (ids, target) = TinyLM().double(), data()
    want = eager_gradients(model, ids, target, loss_fn)
    for k in (3, 7):
        got, report = split_gradients(model, ids, target, loss_fn, fail_after=k)
        assert report.ooms_recovered == 1 and sum(report.chunks) == B
        assert max_difference(got, want) < TOLERANCE


def test_a_token_mean_whose_first_samples_hold_as_many_tokens_each_stays_exact():
    # The loss's check sees up to 8 samples: here all full, the next ones
    # padded. Weighted by samples it was off once they came.
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, V, (12, T), generator=g)
    labels = torch.randint(0, V, (12, T), generator=g)
    mask = torch.ones(12, T, dtype=torch.float64)
    mask[8:, 2:] = 0
    loss_fn = LOSSES["masked select's mean"]
    model = TinyLM().double()
    want = eager_gradients(model, ids, (labels, mask), loss_fn)
    got, report = split_gradients(model, ids, (labels, mask), loss_fn)
    assert list(report.chunks) == [3, 3, 3, 3]
    assert max_difference(got, want) < TOLERANCE


def test_a_mean_over_a_dimension_that_is_not_the_samples_still_weighs_by_samples():
    # Seq-first: each micro-batch's (T,) per-position means hold T elements
    # whatever its samples, so it weighs by its share of the samples.
    def loss_fn(o, labels):
        return F.cross_entropy(o.permute(1, 2, 0), labels.t(), reduction="none").mean(0).mean()

    model, (ids, (labels, _)) = TinyLM().double(), data()
    ids, labels = ids.t().contiguous(), labels.t().contiguous()
    want = eager_gradients(model, ids, labels, loss_fn)
    got, _ = split_gradients(model, ids, labels, loss_fn, batch_dim=1, target_batch_dim=1)
    assert max_difference(got, want) < TOLERANCE


def test_a_sum_over_a_count_the_samples_do_not_own_is_refused():
    def loss_fn(o, t):
        return (per_token(o, t[0]) * t[1]).sum() / torch.full((5,), 2.0).double().sum()

    model, (ids, target) = TinyLM().double(), data()
    with pytest.raises(ValueError, match=r"^\[Trainer.step\] the loss divides a sum by a count "
                                         r"that is not the samples' own"):
        split_gradients(model, ids, target, loss_fn)
