"""A target that does not hold the inputs' samples is refused in one line
naming find_batch_size, the operation the user called, not memfit.profile
that it runs inside."""

import pytest
import torch
import torch.nn.functional as F

import memfit


def _model():
    return torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 50))


def test_a_target_of_other_samples_is_refused_as_find_batch_sizes():
    x, y = torch.randint(0, 50, (8, 16)), torch.randint(0, 50, (8 * 16,))  # flattened early
    with pytest.raises(ValueError, match=r"^\[find_batch_size\] inputs hold 8 samples but "
                                         r"target holds 128"):
        memfit.find_batch_size(_model(), x, y, loss_fn=F.cross_entropy, budget="64MiB")


def test_a_label_beside_seq_first_inputs_is_refused_as_find_batch_sizes():
    x, y = torch.randint(0, 50, (16, 8)), torch.randint(0, 50, (8,))
    with pytest.raises(ValueError, match=r"^\[find_batch_size\] the target is cut along "
                                         r"dimension 1 .* pass target_batch_dim=0"):
        memfit.find_batch_size(_model(), x, y, budget="64MiB", batch_dim=1)
