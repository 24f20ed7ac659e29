"""find_batch_size on an example batch whose attention_mask has no padding
(samples of one length) is held to batches of that length with padding, as
a collate function pads samples of different lengths: Llama's SDPA path
builds its (batch, 1, L, L) mask only where there is padding, and the fit
answered 19 where padded batches run 18 (See Note [A mask without padding],
plan/lengths.py, where the fit per length does the same). The truth is plain
training steps on a simulated device of the budget, not memfit."""

import pytest
import torch

import memfit

pytest.importorskip("transformers")
from test_lengths_mask_without_padding import BUDGET, llama, padded_batch, runs  # noqa: E402


def test_an_example_without_padding_is_fitted_as_a_padded_batch():
    example = padded_batch(4, 64)
    example["attention_mask"] = torch.ones_like(example["attention_mask"])  # no padding
    example["labels"] = example["input_ids"].clone()
    fit = memfit.find_batch_size(llama(), example, optimizer="adam", budget=BUDGET)
    assert runs(fit.max_batch, 64), fit.max_batch
    assert not runs(fit.max_batch + 1, 64)  # what fits, not below it
    assert any("attention_mask has no padding" in n for n in fit.notes), fit.notes
    assert bool((example["attention_mask"] == 1).all())  # the user's example untouched
