"""A fit per length resizes the target along seq_dim too (token labels);
a per-token target has a dimension fewer than inputs whose length is not
their second dimension (a Conv1d's (batch, channels, L) beside (batch,
L) labels), so seq_dim=2 is not one of its dimensions, it kept the
example's length, and the loss raised a bare shape mismatch. The error
says so and names the seq_dim counted from the end, which fits both."""

import pytest
import torch
import torch.nn.functional as F

import memfit


def conv_tagger():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv1d(8, 16, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv1d(16, 5, 1))


def test_a_per_token_target_without_seq_dim_is_named_with_the_dim_from_the_end():
    x, y = torch.randn(4, 8, 24), torch.randint(0, 5, (4, 24))
    with pytest.raises(ValueError, match=r"the target of shape \(4, 24\) has no dimension "
                                         r"seq_dim=2 .* \(seq_dim=-1 here\)"):
        memfit.find_batch_size(conv_tagger(), x, y, loss_fn=F.cross_entropy, optimizer="sgd",
                               budget=8 << 20, seq_dim=2, lengths=[16, 64])
    fit = memfit.find_batch_size(conv_tagger(), x, y, loss_fn=F.cross_entropy, optimizer="sgd",
                                 budget=8 << 20, seq_dim=-1, lengths=[16, 64])
    assert fit.lengths == [16, 64] and fit.verified
