"""A model that draws from a torch.Generator of its own (noise in its
forward with generator=self.g): memfit's rehearsals put that generator
back, as they put back the global ones, so the user's next step draws the
noise it would have drawn without memfit."""

import copy

import pytest
import torch
import torch.nn.functional as F

import memfit


class Noisy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 10)
        self.gens = {"noise": torch.Generator().manual_seed(0)}  # in a container too

    def forward(self, x):
        return self.lin(x + 0.1 * torch.randn(x.shape, generator=self.gens["noise"]))


@pytest.mark.parametrize("how", ["cpu", "meta", "profile"])
def test_a_rehearsal_leaves_the_models_generator_where_it_was(how):
    torch.manual_seed(0)
    model = Noisy()
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    if how == "profile":
        memfit.profile(model, x, y, optimizer=opt)
    else:
        memfit.find_batch_size(model, x, y, optimizer=opt, budget=1 << 20, mode=how)
    assert torch.equal(model.gens["noise"].get_state(), twin.gens["noise"].get_state())
    # The user's next step: the same noise, the same loss, as without memfit.
    assert torch.equal(F.cross_entropy(model(x), y), F.cross_entropy(twin(x), y))
