"""A forward that keeps Python values on the model (a count of its calls, a
scale it decays each call, a list of what it saw): memfit's rehearsals run
the forward a dozen times and must leave them as they were, so the user's
next step computes what it would have without memfit. See Note [A
forward's counters] (user_state.py)."""

import copy

import pytest
import torch
import torch.nn.functional as F

import memfit


class Decaying(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 10)
        self.calls = 0
        self.scale = 1.0
        self.seen = {"batches": []}

    def forward(self, x):
        self.calls += 1
        self.scale *= 0.9
        self.seen["batches"].append(x.shape[0])
        return self.lin(x) * self.scale


@pytest.mark.parametrize("how", ["cpu", "meta", "profile"])
def test_a_rehearsal_leaves_the_forwards_counters_as_they_were(how):
    torch.manual_seed(0)
    model = Decaying()
    model(torch.randn(2, 32))  # one call of the user's before
    twin = copy.deepcopy(model)
    seen = model.seen
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    if how == "profile":
        memfit.profile(model, x, y, optimizer=opt)
    else:
        memfit.find_batch_size(model, x, y, optimizer=opt, budget=1 << 20, mode=how)
    assert (model.calls, model.scale, model.seen) == (1, 0.9, {"batches": [2]})
    assert model.seen is seen
    assert torch.equal(F.cross_entropy(model(x), y), F.cross_entropy(twin(x), y))
