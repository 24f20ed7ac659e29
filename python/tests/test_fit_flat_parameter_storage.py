"""Weights laid out in one flat buffer (contiguous-params style: each
parameter a view of it, the user's optimizer stepping the buffer): a
rehearsal runs on copies and leaves each parameter that very view again,
with its values. Given fresh memory, the weights stopped following the
buffer, and the user's next optimizer step updated memory the model no
longer read."""

import pytest
import torch
import torch.nn.functional as F

import memfit


def _model():
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 10))


def _lay_out(params, flat):
    at = 0
    with torch.no_grad():
        for p in params:
            flat[at:at + p.numel()].copy_(p.flatten())
            p.data = flat[at:at + p.numel()].view_as(p)
            at += p.numel()


class FlatBuffer(torch.nn.Module):
    """The flat buffer registered on the model itself."""

    def __init__(self):
        super().__init__()
        self.net = _model()
        params = list(self.net.parameters())
        self.register_buffer("flat", torch.zeros(sum(p.numel() for p in params)))
        _lay_out(params, self.flat)

    def forward(self, x):
        return self.net(x)


def _follows(params, flat):
    ptr = flat.untyped_storage().data_ptr()
    return all(p.untyped_storage().data_ptr() == ptr for p in params)


def _rehearse(how, model, opt, x, y):
    if how == "profile":
        memfit.profile(model, x, y, optimizer=opt)
    else:
        memfit.find_batch_size(model, x, y, optimizer=opt, budget=2 << 20, mode=how)


@pytest.mark.parametrize("how", ["cpu", "meta", "profile"])
def test_parameters_that_are_views_of_a_flat_buffer_stay_its_views(how):
    torch.manual_seed(0)
    model = _model()
    params = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in params))
    _lay_out(params, flat)
    values = flat.clone()
    opt = torch.optim.SGD(params, lr=0.1)
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    _rehearse(how, model, opt, x, y)
    assert _follows(params, flat)
    assert torch.equal(flat, values)
    assert torch.equal(torch.cat([p.detach().flatten() for p in params]), values)
    with torch.no_grad():
        flat.add_(1.0)  # the user's own update of the buffer reaches the model
    assert torch.equal(torch.cat([p.detach().flatten() for p in params]), values + 1)
    F.cross_entropy(model(x), y).backward()  # and the model still trains
    assert all(p.grad is not None for p in params)


@pytest.mark.parametrize("how", ["cpu", "meta"])
def test_a_registered_flat_buffer_and_its_parameters_share_memory_again(how):
    torch.manual_seed(0)
    model = FlatBuffer()
    params = list(model.net.parameters())
    values = model.flat.clone()
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    _rehearse(how, model, torch.optim.Adam(model.parameters()), x, y)
    assert _follows(params, model.flat)
    assert torch.equal(model.flat, values)
