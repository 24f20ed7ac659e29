"""A fit per length cuts the example along seq_dim; where the cut step
raises, the error says the cut did it and what to check, not only the
model's own shape error (which names shapes memfit made)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memfit


def _fit(model, x, y, seq_dim, lengths):
    return memfit.find_batch_size(model, x, y, loss_fn=F.cross_entropy, budget="64MiB",
                                  mode="cpu", seq_dim=seq_dim, lengths=lengths)


def test_a_seq_dim_that_names_the_features_is_said_to_be_the_cause():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
    with pytest.raises(ValueError) as e:
        _fit(model, x, y, 1, [4, 8])  # dimension 1 is the Linear's features
    said = str(e.value)
    assert said.startswith("[find_batch_size] at length 4 (the example cut from 8 to 4 "
                           "along seq_dim=1, inputs now (4, 4))")
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied" in said
    assert "check that seq_dim is the dimension of the sequence" in said
    assert len(said.splitlines()) == 1


def test_a_model_that_takes_no_shorter_input_is_named_too():
    # A convolution whose kernel is longer than the cut: a length it cannot take.
    model = nn.Sequential(nn.Conv1d(4, 8, kernel_size=9), nn.AdaptiveAvgPool1d(1),
                          nn.Flatten(), nn.Linear(8, 3))
    x, y = torch.randn(2, 4, 32), torch.randint(0, 3, (2,))
    with pytest.raises(ValueError, match=r"at length 4 \(the example cut from 32 to 4 .*"
                                         r"a convolution's kernel"):
        _fit(model, x, y, 2, [4, 32])


def test_the_examples_own_length_raises_the_models_own_error():
    # At the example's own length nothing was cut: the error is the user's.
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    x, y = torch.randn(4, 9), torch.randint(0, 3, (4,))
    with pytest.raises(RuntimeError, match="mat1 and mat2"):
        _fit(model, x, y, 1, [9])
