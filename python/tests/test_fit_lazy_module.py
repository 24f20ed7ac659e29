"""A model with a lazy module not yet run (LazyLinear gets its size at its
first forward) is refused in one line naming the module and the fix, before
anything runs: it raised torch's "Attempted to use an uninitialized
parameter" from inside memfit's rehearsal. Once the user's forward has run,
the same model fits as any other."""

import pytest
import torch

import memfit


def lazy_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.LazyLinear(64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


@pytest.mark.parametrize("call", ["find_batch_size", "profile", "advise"])
def test_an_uninitialized_lazy_module_is_refused_naming_it(call):
    model = lazy_mlp()
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    with pytest.raises(ValueError) as e:
        if call == "find_batch_size":
            memfit.find_batch_size(model, x, y, budget="64MiB")
        elif call == "profile":
            memfit.profile(model, x, y)
        else:
            memfit.advise(model, x, y, budget="64MiB")
    line = str(e.value)
    assert line.startswith(f"[{call}] the model's 0.weight is not initialized yet"), line
    assert "run model(example) once first" in line and "\n" not in line
    assert torch.nn.parameter.is_lazy(model[0].weight)  # nothing ran


def test_after_its_first_forward_it_fits():
    model = lazy_mlp()
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    model(x)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fit = memfit.find_batch_size(model, x, y, optimizer=opt, budget="4MiB")
    assert fit.max_batch > 8 and fit.verified
