"""A batch that is a NamedTuple (torch's default collate keeps one) or a
dataclass (a custom collate's): memfit cuts, repeats and splits it into
batches of the same kind, so the user's step reads its fields as in the
user's loop. The truth is plain steps on a simulated device of the budget
and, for the Trainer, the whole batch's gradients in float64."""

import dataclasses
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import plain_steps_run


class Pair(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor
    name: str = "train"


def build(dtype=torch.float32):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 4)).to(dtype)
    return model, torch.optim.Adam(model.parameters())


def data(kind, n, dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(n, 32, generator=g, dtype=dtype), torch.randint(0, 4, (n,), generator=g)
    return kind(x, y)


@pytest.mark.parametrize("kind", [Pair, Batch])
def test_a_batch_of_fields_is_fitted_with_the_users_step_reading_its_fields(kind):
    # Before: "[batch] expected a tensor or a tuple/list/dict of tensors, got
    # Batch" for a dataclass, and a plain tuple (no .x) for a NamedTuple.
    def step(model, batch):
        # Asserted here: a set the step added to would be put back after
        # the rehearsal (Note [What the user's functions keep]).
        assert type(batch) is kind, type(batch)
        return F.cross_entropy(model(batch.x), batch.y)

    budget = 4 << 20
    model, opt = build()
    fit = memfit.find_batch_size(model, data(kind, 8), step=step, optimizer=opt, budget=budget)
    assert fit.verified

    def plain(m, o):
        b = data(kind, fit.max_batch)
        F.cross_entropy(m(b.x), b.y).backward()
        o.step()
        o.zero_grad()

    assert plain_steps_run(budget, build, plain), fit


def test_the_trainer_splits_a_dataclass_batch_into_dataclass_micro_batches():
    def sgd(model):
        return torch.optim.SGD(model.parameters(), lr=0.5)

    model, _ = build(torch.float64)
    want, _ = build(torch.float64)
    batch = data(Batch, 64, torch.float64)

    def step(m, b):
        assert isinstance(b, Batch) and b.name == "train"
        return F.cross_entropy(m(b.x), b.y)

    trainer = memfit.Trainer(model, sgd(model), step=step, micro_batch=16, plan=False)
    assert trainer.step(batch).micro_batches == 4
    plain = sgd(want)
    F.cross_entropy(want(batch.x), batch.y).backward()
    plain.step()
    for p, q in zip(model.parameters(), want.parameters()):
        # float64: the gradient as four micro-batches' weighted sums against
        # one; a few ulps of it, times lr, beside weights of order 0.1.
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14)
