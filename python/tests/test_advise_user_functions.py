"""advise (and estimate_costs) runs the user's loss function and the model's hooks in its
recordings, its eval rows and its timed steps: what they keep (a counter,
a list of logged values) is put back after, as a rehearsal puts it back
(Note [What the user's functions keep]); the eval rows and the timed
steps left a count of 1 and of 8."""

import torch
from torch import nn

import memfit

pytestmark = __import__("pytest").mark.torch_api  # see python/tests/conftest.py


def test_advise_leaves_the_users_counters_and_logs_as_they_were():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 10))
    calls = {"loss": 0, "hook": 0}
    logged = []

    def loss_fn(out, y):
        calls["loss"] += 1
        loss = nn.functional.cross_entropy(out, y)
        logged.append(loss.detach())
        return loss

    def hook(module, inputs, output):
        calls["hook"] += 1

    model[0].register_forward_hook(hook)
    x, y = torch.randn(256, 32), torch.randint(0, 10, (256,))
    plain = memfit.advise(model, x, y, loss_fn=loss_fn, optimizer="adam",
                          repeats=0).plain_peak_bytes
    advice = memfit.advise(model, x, y, loss_fn=loss_fn, optimizer="adam",
                           budget=plain * 9 // 10, repeats=1)
    assert advice.plan.found and advice.plan.time_measured, advice.table()
    assert calls == {"loss": 0, "hook": 0} and logged == []


def test_estimate_costs_leaves_the_users_counter_as_it_was():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    calls = []

    def loss_fn(out, y):
        calls.append(1)
        return nn.functional.cross_entropy(out, y)

    rows = memfit.estimate_costs(model, torch.randn(16, 32), torch.randint(0, 10, (16,)),
                                 loss_fn=loss_fn)
    assert rows and calls == []
