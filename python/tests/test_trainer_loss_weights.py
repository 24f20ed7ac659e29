"""The Trainer's split step equals one eager step on the whole batch for the
losses people write: each micro-batch weighted by the rule
memfit.lazy uses (see Note [How a chunk's loss counts in the batch's]), the
reduction probed, not guessed; and a split step with dropout says that its
masks differ."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import memfit

torch.set_default_dtype(torch.float32)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).double()


def batch(ignored=40):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 16, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (64,), generator=g)
    y[:ignored] = -100  # the ignored targets all in the first micro-batches
    return x, y


def eager_step(model, x, y, loss_fn, lr=0.1):
    m = copy.deepcopy(model)
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    loss = loss_fn(m(x), y)
    loss.backward()
    opt.step()
    return m, loss.item()


def split_step(model, x, y, loss_fn, micro_batch=16, lr=0.1, **kwargs):
    m = copy.deepcopy(model)
    t = memfit.Trainer(m, torch.optim.SGD(m.parameters(), lr=lr), loss_fn,
                       micro_batch=micro_batch, **kwargs)
    return m, t.step(x, y)


def max_difference(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("loss_fn,ignored", [
    (nn.CrossEntropyLoss(), -100),                            # D1: ignore_index=-100
    (nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=torch.float64)), -100),
    (nn.CrossEntropyLoss(ignore_index=2), 2),
    (lambda o, t: F.nll_loss(F.log_softmax(o, 1), t), -100),
], ids=["ignore_index", "class_weight", "ignore_class_2", "nll_lambda"])
def test_counted_targets_weigh_each_micro_batch(loss_fn, ignored):
    model = mlp()
    x, y = batch()
    y[y == -100] = ignored
    want, want_loss = eager_step(model, x, y, loss_fn)
    got, report = split_step(model, x, y, loss_fn)
    assert report.micro_batches == 4
    # float64 throughout: what is left is rounding.
    assert max_difference(got, want) < 1e-12
    assert report.loss == pytest.approx(want_loss, rel=1e-12)


def test_an_oom_redone_micro_batch_keeps_the_counted_targets_exact():
    model = mlp()
    x, y = batch(ignored=24)
    loss_fn = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=torch.float64))
    want, want_loss = eager_step(model, x, y, loss_fn)
    for k in (3, 9, 17):
        m = copy.deepcopy(model)
        t = memfit.Trainer(m, torch.optim.SGD(m.parameters(), lr=0.1), loss_fn, micro_batch=32)
        with memfit.track():
            memfit._memfit.fail_allocation_after(k)
            r = t.step(x, y)
            memfit._memfit.fail_allocation_after(0)
        assert r.ooms_recovered == 1 and sum(r.chunks) == 64
        assert max_difference(m, want) < 1e-12
        assert r.loss == pytest.approx(want_loss, rel=1e-12)


def test_the_sweep_reproducer_d1_under_a_budget():
    # The sweep's own lines: float32, a 20 KiB budget that splits the batch.
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(64, 16); y = torch.randint(0, 4, (64,)); y[:40] = -100  # noqa: E702
    want, want_loss = eager_step(m, x, y, nn.CrossEntropyLoss())
    got = copy.deepcopy(m)
    r = memfit.Trainer(got, torch.optim.SGD(got.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                       budget="20KiB").step(x, y)
    assert r.micro_batches > 1
    # float32, whatever the split: the loss is a mean over the 24 counted
    # targets summed in another order (<= 2 * 23 u) with weights counted/24
    # (one rounding each): < 64 u = 2^-18. A parameter is p - 0.1 g rounded
    # once (u |p| <= 0.26 u each side) with 0.1 |g| <= 0.0093 off by 2 * 23 u
    # times a cancellation of at most 8.9 (measured per sample in float64): < 4 u
    # in all, 2^-21 = 8 u. Measured 0 for both on AMX and AVX2 (split [32, 32]).
    assert r.loss == pytest.approx(want_loss, rel=2.0**-18)
    assert max_difference(got, want) <= 2.0**-21


def test_a_lambda_that_sums_is_weighted_as_a_sum():  # D2
    model = mlp()
    x, y = batch(ignored=0)
    loss_fn = lambda o, t: F.cross_entropy(o, t, reduction="sum")  # noqa: E731
    want, want_loss = eager_step(model, x, y, loss_fn)
    got, report = split_step(model, x, y, loss_fn)
    assert max_difference(got, want) < 1e-12
    assert report.loss == pytest.approx(want_loss, rel=1e-12)


@pytest.mark.parametrize("loss_fn,kind", [
    (lambda o, t: 0.5 * F.mse_loss(o, t.double().unsqueeze(1).expand_as(o)), "mean"),
    (lambda o, t: (o.sum(1) - t.double()).pow(2).sum() * 0.5, "sum"),
], ids=["scaled_mean", "scaled_sum"])
def test_a_loss_made_otherwise_is_probed_by_its_values(loss_fn, kind):
    model = mlp()
    x, y = batch(ignored=0)
    want, want_loss = eager_step(model, x, y, loss_fn, lr=0.01)
    got, report = split_step(model, x, y, loss_fn, lr=0.01)
    assert max_difference(got, want) < 1e-12
    assert report.loss == pytest.approx(want_loss, rel=1e-12)


def test_a_loss_that_is_neither_mean_nor_sum_is_refused():
    model = mlp()
    x, y = batch(ignored=0)
    loss_fn = lambda o, t: F.cross_entropy(o, t).sqrt()  # noqa: E731
    with pytest.raises(ValueError, match=r"^\[Trainer.step\] cannot tell how loss_fn reduces "
                                         r".*reduction='mean' or 'sum'"):
        split_step(model, x, y, loss_fn)
    # Unsplit, the weight is 1 whatever the rule: nothing to refuse.
    got, _ = split_step(model, x, y, loss_fn, micro_batch=64)
    want, _ = eager_step(model, x, y, loss_fn)
    assert max_difference(got, want) < 1e-12


def test_a_reduction_that_contradicts_the_loss_is_refused():  # D3
    model = mlp()
    with pytest.raises(ValueError, match=r"^\[Trainer\] reduction='sum' contradicts the loss's "
                                         r"own reduction 'mean'"):
        memfit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                       nn.CrossEntropyLoss(), reduction="sum")
    x, y = batch(ignored=0)
    loss_fn = lambda o, t: F.cross_entropy(o, t)  # noqa: E731
    with pytest.raises(ValueError, match=r"^\[Trainer.step\] reduction='sum', but the loss is "
                                         r"cross_entropy reducing with mean"):
        split_step(model, x, y, loss_fn, reduction="sum")


def test_dropout_in_a_split_step_is_said_in_the_report():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.1), nn.ReLU(), nn.Linear(32, 4))
    x, y = batch(ignored=0)
    x = x.float()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    r = memfit.Trainer(model, opt, nn.CrossEntropyLoss(), micro_batch=16).step(x, y)
    assert len(r.notes) == 1
    assert r.notes[0].startswith("dropout drew its masks per micro-batch (4 of them)")
    assert "1 (Dropout, p=0.1)" in r.notes[0]
    # Printing the report shows it.
    assert repr(r).endswith(f", notes=[{r.notes[0]!r}])"), repr(r)
    # Whole, or with the dropout in eval mode: an eager step, nothing to say.
    assert memfit.Trainer(model, opt, nn.CrossEntropyLoss()).step(x, y).notes == []
    model[1].eval()
    assert memfit.Trainer(model, opt, nn.CrossEntropyLoss(), micro_batch=16).step(x, y).notes == []


@pytest.mark.numerics
def test_without_dropout_a_split_step_equals_eager_with_no_note():
    model = mlp()
    x, y = batch(ignored=0)
    want, _ = eager_step(model, x, y, nn.CrossEntropyLoss())
    got, report = split_step(model, x, y, nn.CrossEntropyLoss())
    assert report.notes == []
    assert max_difference(got, want) < 1e-12


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(11, 8)
        self.out = nn.Linear(8, 11)

    def forward(self, ids):
        return self.out(self.emb(ids.clamp(min=0)))


def test_a_language_model_loss_that_shifts_its_labels_is_exact():
    # The targets the loss counts are derived (shifted by one, padding
    # ignored): the batch's count is known only once every chunk ran.
    model = TinyLM().double()
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 11, (24, 10), generator=g)
    for i in range(24):
        ids[i, 10 - (i % 7) - 1:] = -100  # padding of varying length
    loss_fn = lambda logits, labels: F.cross_entropy(  # noqa: E731
        logits[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1))
    want, want_loss = eager_step(model, ids, ids, loss_fn)
    got, report = split_step(model, ids, ids, loss_fn, micro_batch=5)
    assert report.micro_batches == 5
    assert max_difference(got, want) < 1e-12
    assert report.loss == pytest.approx(want_loss, rel=1e-12)
