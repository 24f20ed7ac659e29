"""An error the model's own forward raises (an input it does not take)
reaches the user as torch raised it, its type kept, with one note naming
what memfit called the forward with: the traceback runs through memfit's
frames, and without the note it read as memfit's failure."""

import sys

import pytest
import torch
from torch import nn

import memfit

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="notes: Python 3.11")


def mlp():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def test_a_shape_the_model_does_not_take_is_named_in_a_note():
    x, y = torch.randn(64, 31), torch.randint(0, 10, (64,))
    with pytest.raises(RuntimeError, match="mat1 and mat2") as caught:
        memfit.find_batch_size(mlp(), x, y, budget="8MiB")
    notes = [n for n in getattr(caught.value, "__notes__", ()) if n.startswith("memfit:")]
    assert notes == ["memfit: raised by the model's own forward, called with tensors "
                     "(64, 31) float32 on cpu"]


def test_an_error_in_a_dict_batch_names_each_tensor():
    class Keyed(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, features, mask):
            return self.net(features) * mask

    batch = {"features": torch.randn(8, 32), "mask": torch.ones(8, 3)}
    with pytest.raises(RuntimeError) as caught:
        memfit.profile(Keyed(), batch, torch.randint(0, 10, (8,)))
    assert caught.value.__notes__ == [
        "memfit: raised by the model's own forward, called with tensors "
        "(8, 32) float32 on cpu, (8, 3) float32 on cpu"]
