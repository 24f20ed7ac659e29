"""Numbers past what memfit can answer are refused, not wrapped."""

import pytest
import torch

import memfit


@pytest.mark.slow
def test_prediction_past_the_batch_cap_is_refused_not_overflowed():
    m = torch.nn.Sequential(torch.nn.Linear(8, 4))
    r = memfit.profile(m, torch.randn(4, 8), torch.randn(4, 4), optimizer="sgd")
    big = r.predict_peak_bytes(2**40)
    assert big > r.predict_peak_bytes(2**20) > 0
    with pytest.raises(ValueError, match="outside what memfit predicts"):
        r.predict_peak_bytes(2**60)  # once 2704 B: the product left int64
