"""advise on a torch.compile'd model: torch.compile as a row, and
activation_memory_budget planned in bytes, measured, verified and applied."""

import json

import pytest
import torch

import memfit
from memfit.plan.strategies.compiler import dropout_of

pytestmark = pytest.mark.torch_api  # see python/tests/conftest.py


class Wide(torch.nn.Module):
    """Layers held as attributes, not in a container: advise finds no chain
    to checkpoint (fewer recordings, fewer compiles)."""

    def __init__(self, d=128, drop=0.0):
        super().__init__()
        self.a = torch.nn.Linear(d, d)
        self.b = torch.nn.Linear(d, d)
        self.c = torch.nn.Linear(d, d)
        self.out = torch.nn.Linear(d, 10)
        self.drop = torch.nn.Dropout(drop)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.a(x))
        h = torch.nn.functional.gelu(self.b(self.drop(h)))
        return self.out(torch.nn.functional.gelu(self.c(h)))


def test_dropout_is_named_where_it_draws():
    assert dropout_of(Wide()) is None  # p=0 draws nothing
    assert dropout_of(Wide(drop=0.1)) == "dropout p=0.1 at drop"


@pytest.mark.slow
def test_advise_plans_an_activation_memory_budget_that_fits_where_the_compiled_step_does_not():
    torch.manual_seed(0)
    model = torch.compile(Wide())
    x, y = torch.randn(256, 128), torch.randint(0, 10, (256,))
    plain = memfit.profile(model, x, y, optimizer="adam").peak_bytes
    budget = int(plain * 0.92)
    advice = memfit.advise(model, x, y, optimizer="adam", budget=budget, repeats=0)

    names = [r.name for r in advice.compile_rows]
    assert names[0] == "without torch.compile (eager)"
    plan = advice.compile_plan
    assert plan.found and plan.exact and plan.fraction is not None and plan.fraction < 1
    assert plan.peak_bytes <= budget < plain
    # Measured largest first: every larger fraction measured did not fit.
    budgets = [r for r in advice.compile_rows if r.kind == "memory_budget"]
    assert budgets[-1].fraction == plan.fraction and budgets[-1].fits
    assert all(not r.fits for r in budgets[:-1])
    assert "activation_memory_budget" in advice.table()
    assert json.loads(advice.to_json())["compiler"]["plan"]["fraction"] == plan.fraction

    # Applied: one real compiled step of the model with the plan fits.
    with advice.apply(model, plan) as applied:
        r = memfit.profile(applied, x, y, optimizer="adam")
    assert r.peak_bytes == plan.peak_bytes <= budget
    assert r.compile.compiled  # its own compile, not the model's cache
    assert memfit.profile(model, x, y, optimizer="adam").peak_bytes == plain  # restored
