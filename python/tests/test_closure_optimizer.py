"""An optimizer whose step() needs a closure (LBFGS) cannot end memfit's
step, which calls optimizer.step() once after backward: refused before
anything runs, with one line naming the operation and the fix, not
torch's TypeError from inside the rehearsal."""

import pytest
import torch

import memfit


def test_an_optimizer_that_needs_a_closure_is_refused_with_one_line():
    model = torch.nn.Linear(16, 4)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    lbfgs = torch.optim.LBFGS(model.parameters())
    with pytest.raises(ValueError, match=r"^\[find_batch_size\] LBFGS.step\(\) needs a closure"):
        memfit.find_batch_size(model, x, y, optimizer=lbfgs, budget=1 << 20)
    with pytest.raises(ValueError, match=r"^\[profile\] LBFGS.step\(\) needs a closure"):
        memfit.profile(model, x, y, optimizer=lbfgs)
    with pytest.raises(ValueError, match=r"^\[Trainer\] LBFGS.step\(\) needs a closure"):
        memfit.Trainer(model, lbfgs, budget=1 << 20)


def test_first_order_optimizers_with_an_optional_closure_are_taken():
    model = torch.nn.Linear(16, 4)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    for opt in (torch.optim.Adam(model.parameters()), torch.optim.SGD(model.parameters(), 0.1)):
        assert memfit.profile(model, x, y, optimizer=opt).peak_bytes > 0
