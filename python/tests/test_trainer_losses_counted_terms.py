"""A split step of a loss that adds terms counted otherwise than by samples
(cross_entropy with ignored targets or class weights, a sum over a count)
equals the float64 step on the whole batch by hand, or is refused in one
line: never weighed by samples where the first samples happen to hold as
many counted targets each (See Note [A term that counts the batch
otherwise], loss_weighting.py)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import memfit

B, D, C = 24, 6, 5
WEIGHT = torch.tensor([0.3, 1.0, 2.5, 0.7, 1.9], dtype=torch.float64)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, 12), nn.Tanh(), nn.Linear(12, C)).double()


def batch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, D, generator=g, dtype=torch.float64)
    y = torch.randint(0, C, (B,), generator=g)
    return x, y


def ignored_late(y):
    """Ignored targets in later samples only: the first micro-batch's
    samples each count one."""
    y = y.clone()
    y[[9, 13, 14, 20, 21, 22]] = -100
    return y


def l2(model):
    return sum(p.pow(2).sum() for p in model.parameters())


def by_hand(model, x, y, loss_fn):
    """The user's own step on the whole batch: SGD, float64."""
    m = copy.deepcopy(model)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    loss = loss_fn(m)(m(x), y)
    loss.backward()
    opt.step()
    return m, loss.item()


def split(model, x, y, loss_fn, micro_batch=6, **kwargs):
    m = copy.deepcopy(model)
    t = memfit.Trainer(m, torch.optim.SGD(m.parameters(), lr=0.5), loss_fn(m),
                       micro_batch=micro_batch, **kwargs)
    return m, t.step(x, y)


def max_relative_difference(a, b):
    return max(((p - q).abs().max() / q.abs().max()).item()
               for p, q in zip(a.parameters(), b.parameters()))


# Each was weighed by samples (the probe's values on the first 6 samples,
# which hold one counted target each, agree with their mean), its split step
# off the whole batch's by the relative figure in the comment.
REFUSED = {
    "two_heads": lambda m: lambda o, t: F.cross_entropy(o, t) + F.cross_entropy(2 * o, t),  # 0.50
    "ce_plus_l2": lambda m: lambda o, t: F.cross_entropy(o, t) + 1e-3 * l2(m),  # 0.14
    "mean_of_heads": lambda m: lambda o, t: torch.stack(
        [F.cross_entropy(o, t), F.cross_entropy(2 * o, t)]).mean(),  # 0.23
    "token_mean_plus_constant": lambda m: lambda o, t: F.cross_entropy(
        o, t, reduction="sum") / (t != -100).sum() + 1e-3 * l2(m),  # 0.14
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_term_counted_otherwise_is_refused_not_weighed_by_samples(name):
    model = mlp()
    x, y = batch()
    y = ignored_late(y)
    kept = [p.detach().clone() for p in model.parameters()]
    got = copy.deepcopy(model)
    trainer = memfit.Trainer(got, torch.optim.SGD(got.parameters(), lr=0.5),
                             REFUSED[name](got), micro_batch=6)
    with pytest.raises(ValueError, match="averages over what its samples hold in different"):
        trainer.step(x, y)
    # The refused step did not happen.
    assert all(torch.equal(p, k) for p, k in zip(got.parameters(), kept))
    assert all(p.grad is None for p in got.parameters())


def test_a_declared_mean_is_refused_too():
    model = mlp()
    x, y = batch()
    with pytest.raises(ValueError, match="averages over what its samples hold in different"):
        split(model, x, ignored_late(y), REFUSED["two_heads"], reduction="mean")


def test_class_weighted_heads_of_sorted_data_are_refused():
    # Sorted targets: the first micro-batch's samples are all of class 0, so
    # its values agree with a mean over samples; the class weights do not
    # (0.21 relative off the whole batch's before).
    model = mlp()
    x, y = batch()
    y = torch.sort(y).values

    def two_heads(m):
        return lambda o, t: (F.cross_entropy(o, t, weight=WEIGHT)
                             + 0.1 * F.cross_entropy(2 * o, t, weight=WEIGHT))

    with pytest.raises(ValueError, match="averages over what its samples hold in different"):
        split(model, x, y, two_heads)


def test_a_step_function_adding_a_term_is_refused():
    model = mlp()
    x, y = batch()
    y = ignored_late(y)
    m = copy.deepcopy(model)

    def step(mod, b):
        return F.cross_entropy(mod(b[0]), b[1]) + 1e-3 * l2(mod)

    t = memfit.Trainer(m, torch.optim.SGD(m.parameters(), lr=0.5), step=step, micro_batch=6)
    with pytest.raises(ValueError, match="averages over what its samples hold in different"):
        t.step((x, y))


# Each was weighed by samples before (the mode did not see the sum over a
# count), its split step off by the relative figure in the comment; now a sum
# over the batch's counted targets, exact.
EXACT = {
    "two_sums_over_count": lambda m: lambda o, t: (
        F.cross_entropy(o, t, reduction="sum") + F.cross_entropy(2 * o, t, reduction="sum")
    ) / (t != -100).sum(),  # 0.50
    "sum_over_dim_over_count": lambda m: lambda o, t: (
        F.cross_entropy(o, t, reduction="none") * (t != -100)).sum(0) / (t != -100).sum(),  # 0.14
    "sum_over_a_cast_count": lambda m: lambda o, t: F.cross_entropy(
        o, t, reduction="sum") / (t != -100).sum().double(),  # 0.14
    # Unchanged, exact before and after.
    "ce_plus_l2_no_ignored": lambda m: lambda o, t: F.cross_entropy(
        o, t.clamp(min=0)) + 1e-3 * l2(m),
    "ce_mean_plus_mse": lambda m: lambda o, t: F.cross_entropy(o, t.clamp(min=0)) + F.mse_loss(
        o, F.one_hot(t.clamp(min=0), C).double()),
}


@pytest.mark.parametrize("name", sorted(EXACT))
@pytest.mark.parametrize("micro_batch", [5, 6])
def test_a_sum_over_the_count_is_exact(name, micro_batch):
    model = mlp()
    x, y = batch()
    y = ignored_late(y)
    want, want_loss = by_hand(model, x, y, EXACT[name])
    got, report = split(model, x, y, EXACT[name], micro_batch=micro_batch)
    assert report.micro_batches > 1
    # float64: the sums' order differs, a few ulps of the step.
    assert max_relative_difference(got, want) < 1e-12
    assert report.loss == pytest.approx(want_loss, rel=1e-12)


def test_an_oom_redone_micro_batch_keeps_a_constant_term_allowed():
    # The L2 term's .mean() counts the weights whatever the chunk: a redo of
    # a micro-batch at another size is not a term counted otherwise.
    model = mlp()
    x, y = batch()

    def loss_fn(m):
        return lambda o, t: F.cross_entropy(o, t) + 1e-3 * sum(
            p.pow(2).mean() for p in m.parameters())

    want, _ = by_hand(model, x, y, loss_fn)
    for k in (5, 17, 40):
        m = copy.deepcopy(model)
        t = memfit.Trainer(m, torch.optim.SGD(m.parameters(), lr=0.5), loss_fn(m),
                           micro_batch=8)
        with memfit.track():
            memfit._memfit.fail_allocation_after(k)
            try:
                r = t.step(x, y)
            finally:
                memfit._memfit.fail_allocation_after(0)
        assert r.ooms_recovered >= 1 and sum(r.chunks) == B
        assert max_relative_difference(m, want) < 1e-12
