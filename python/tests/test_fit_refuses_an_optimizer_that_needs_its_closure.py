"""An optimizer whose step takes closure=None but needs it all the same
(SAM's first and second step around a second forward and backward: it
asserts a closure) is refused in one line, as LBFGS is: it raised
SAM's bare AssertionError from inside the rehearsal. The user's weights
are as they were."""

import pytest
import torch
import torch.nn.functional as F

import memfit


class SAMLike(torch.optim.SGD):
    """Sharpness-aware minimization's step as its reference implementation
    writes it: closure optional in the signature, asserted in the body."""

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is not None, "Sharpness Aware Minimization requires closure, but it " \
                                    "was not provided"
        with torch.enable_grad():
            closure()
        return super().step()


@pytest.mark.parametrize("what", ["find_batch_size", "profile"])
def test_an_optimizer_asserting_a_closure_is_refused_in_one_line(what):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    before = [p.detach().clone() for p in model.parameters()]
    opt = SAMLike(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    with pytest.raises(ValueError, match=rf"^\[{what}\] SAMLike.step\(\) needs a closure"):
        if what == "profile":
            memfit.profile(model, x, y, optimizer=opt)
        else:
            memfit.find_batch_size(model, x, y, optimizer=opt, budget=1 << 20)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters()) and not opt.state
    F.cross_entropy(model(x), y).backward()  # the user's own loop still runs
