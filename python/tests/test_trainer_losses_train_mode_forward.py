"""A forward that mixes the batch's samples only in training mode (a custom
centring, a batch norm of its own) is refused when split, not weighed as if
each sample stood alone: the check that runs the step again runs it in the
modules' own modes, dropout's in eval mode, on fresh copies of the buffers
(See Note [A forward that mixes the samples only in training mode],
loss_weighting.py). The truth: the float64 step on the whole batch by hand."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import memfit

B, D, C = 24, 6, 5


class Centre(nn.Module):
    """Subtracts the batch's mean in training mode only."""

    def forward(self, x):
        return x - x.mean(0) if self.training else x


class Counter(nn.Module):
    """Counts its calls in training mode in a buffer and divides by the
    count, written before it is read (the step's backward needs the value it
    read): the same for every sample, so no mixing."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.float64))

    def forward(self, x):
        if self.training:
            self.calls.add_(1)
        return x / self.calls


def model_with(*layers):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, 12), *layers, nn.Tanh(), nn.Linear(12, C)).double()


def batch():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(B, D, generator=g, dtype=torch.float64),
            torch.randint(0, C, (B,), generator=g))


def by_hand(model, x, y):
    m = copy.deepcopy(model)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    F.cross_entropy(m(x), y).backward()
    opt.step()
    return m


def trainer(m, **kwargs):
    return memfit.Trainer(m, torch.optim.SGD(m.parameters(), lr=0.5), micro_batch=6, **kwargs)


def max_relative_difference(a, b):
    return max(((p - q).abs().max() / q.abs().max()).item()
               for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("dropout", [False, True], ids=["plain", "beside_dropout"])
def test_a_forward_centring_in_training_mode_is_refused(dropout):
    # Split, its gradients were 0.076 relative off the whole batch's, and
    # nothing said so (the rerun in eval mode did not centre).
    layers = (Centre(), nn.Dropout(0.3)) if dropout else (Centre(),)
    m = model_with(*layers)
    kept = [p.detach().clone() for p in m.parameters()]
    rng = torch.get_rng_state()
    x, y = batch()
    with pytest.raises(ValueError, match=r"the model's forward mixes the batch's samples"):
        trainer(m, loss_fn=nn.CrossEntropyLoss()).step(x, y)
    assert all(torch.equal(p, k) for p, k in zip(m.parameters(), kept))
    # The refused step put back the RNG its micro-batches drew from.
    assert torch.equal(torch.get_rng_state(), rng)
    assert m.training and m[1].training


def test_a_step_function_of_such_a_forward_is_refused():
    m = model_with(Centre())
    x, y = batch()
    with pytest.raises(ValueError, match=r"mixes the batch's samples"):
        trainer(m, step=lambda mod, b: F.cross_entropy(mod(b[0]), b[1])).step((x, y))


def test_the_samples_apart_in_training_mode_split_exactly():
    # No mixing in either mode: the check in training mode passes and the
    # split step is the whole batch's, in float64 to a few ulps.
    m = model_with(nn.LayerNorm(12))
    x, y = batch()
    want = by_hand(m, x, y)
    r = trainer(m, loss_fn=nn.CrossEntropyLoss()).step(x, y)
    assert r.micro_batches == 4
    assert max_relative_difference(m, want) < 1e-12


def test_a_buffer_the_forward_writes_and_reads_keeps_the_steps_backward():
    # The check's runs write copies of the buffer, not the one the step's
    # forward saved for its backward (a write there would fail that backward
    # as an in-place modification); the step's own writes stay, named in its
    # notes as before (each micro-batch read what the ones before it wrote).
    m = model_with(Counter())
    x, y = batch()
    r = trainer(m, loss_fn=nn.CrossEntropyLoss()).step(x, y)
    assert r.micro_batches == 4
    assert any("wrote buffers" in n for n in r.notes)
    # One count per micro-batch: the check's runs left nothing in it.
    assert m[1].calls.item() == 4
