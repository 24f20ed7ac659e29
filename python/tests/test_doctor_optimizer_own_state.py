"""The doctor on a loop whose optimizer keeps an entry of its own in its
state (state["global_step"] = n, not a parameter's dict; torch's state_dict
carries such entries too): the loop runs as it does without the doctor, and
a correct loop gets no finding. It raised AttributeError ('int' object has
no attribute 'values') at the block's end."""

import torch
import torch.nn.functional as F
from torch import nn

import memfit


class CountingAdam(torch.optim.Adam):
    @torch.no_grad()
    def step(self, closure=None):
        self.state["global_step"] = self.state.get("global_step", 0) + 1
        return super().step(closure)


def test_an_optimizers_own_state_entry_is_not_a_parameters_dict():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = CountingAdam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    with memfit.doctor(model, opt) as d:
        for _ in range(4):
            x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    assert opt.state["global_step"] == 4
    assert d.findings == [], d.report()
