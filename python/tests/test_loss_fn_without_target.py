"""Without a target, a loss_fn written as the docs give it, taking (output,
target), gets (output, None); one that takes the output alone gets it
alone. `lambda out, _: out.loss` beside a batch that carries its labels
raised "missing 1 required positional argument"."""

import types

import torch
import torch.nn.functional as F
from torch import nn

import memfit


class LabelledMLP(nn.Module):
    """Computes its own loss from the labels in the batch, as an HF model."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x, labels):
        logits = self.net(x)
        return types.SimpleNamespace(logits=logits, loss=F.cross_entropy(logits, labels))


def batch():
    g = torch.Generator().manual_seed(1)
    return {"x": torch.randn(16, 32, generator=g), "labels": torch.randint(0, 10, (16,), generator=g)}


def test_a_two_argument_loss_fn_gets_none_for_the_target():
    def loss_fn(out, target):
        # What it saw cannot be kept: a rehearsal puts back what the user's
        # functions keep.
        assert target is None, target
        return out.loss

    two = memfit.find_batch_size(LabelledMLP(), batch(), loss_fn=loss_fn, optimizer="sgd",
                                 budget="4MiB")
    one = memfit.find_batch_size(LabelledMLP(), batch(), loss_fn=lambda out: out.loss,
                                 optimizer="sgd", budget="4MiB")
    assert two.max_batch == one.max_batch > 16
