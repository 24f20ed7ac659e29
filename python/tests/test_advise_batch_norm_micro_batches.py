"""A model with BatchNorm in training: micro-batches normalize each with its
own statistics, so advise plans them only with allow_approximate, says the
plan changes the numbers, and the plan, trained as it says (memfit.Trainer
with coupled='allow'), runs within the budget in plain steps. Without
allow_approximate the line it raises names the layers."""

import pytest
import torch

import memfit
from memfit.testing.truth import plain_steps_run

pytestmark = pytest.mark.torch_api  # see python/tests/conftest.py

N = 16
KW = dict(loss_fn=torch.nn.functional.cross_entropy, repeats=0)


def make_model():
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


@pytest.fixture(scope="module")
def case():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(N, 3, 16, 16, generator=g), torch.randint(0, 10, (N,), generator=g)
    model = make_model()
    plain = memfit.advise(model, x, y, optimizer=sgd(model), **KW).plain_peak_bytes
    return x, y, plain * 3 // 4  # below every whole-batch step; half the batch fits


def test_micro_batches_of_a_batch_norm_model_are_not_planned_as_the_same_result(case):
    x, y, budget = case
    model = make_model()
    with pytest.raises(memfit.DoesNotFit) as e:
        memfit.advise(model, x, y, optimizer=sgd(model), budget=budget, **KW)
    assert "micro-batches were not tried: the BatchNorm layers (1, 4)" in str(e.value)
    assert "allow_approximate=True tries them" in str(e.value)


def test_the_approximate_plan_in_micro_batches_trains_within_the_budget(case):
    x, y, budget = case
    model = make_model()
    advice = memfit.advise(model, x, y, optimizer=sgd(model), budget=budget,
                           allow_approximate=True, **KW)
    plan = advice.plan
    assert plan.found and 0 < plan.micro_batch < N and not plan.exact, advice.table()
    assert "changes the numbers" in advice.table()
    assert any("normalized with its own statistics" in n for n in advice.notes)

    def build():
        m = make_model()
        applied = advice.apply_plan(m, sgd(m))
        trainer = memfit.Trainer(applied.model, applied.optimizer, micro_batch=plan.micro_batch,
                                 plan=False, coupled="allow", loss_fn=KW["loss_fn"])
        return trainer, x.clone(), y.clone()

    assert plain_steps_run(budget, build, lambda t, xs, ys: t.step(xs, ys), steps=3)
