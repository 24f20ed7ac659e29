"""A fit per length resizes one dimension per input (seq_dim): an input
with a second length dimension, a (batch, L, L) mask, is left L long
along it, and the step fails on the shapes. The error names that input
and what to do, not a bare shape mismatch from inside the model (below
the example's length) nor a model that takes at most some length (above
it)."""

import pytest
import torch
import torch.nn.functional as F

import memfit

VOCAB = 50


class PairwiseMasked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, x, mask):
        z = self.tok(x)
        scores = (z @ z.transpose(1, 2)).masked_fill(~mask, -1e9)
        return self.head(scores.softmax(-1) @ z)


def token_loss(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


@pytest.mark.parametrize("lengths", [[8, 16], [32, 64]])
def test_a_pairwise_mask_left_at_the_examples_length_is_named(lengths):
    x = torch.randint(0, VOCAB, (4, 24))
    mask = torch.ones(4, 24, 24, dtype=torch.bool).tril()
    with pytest.raises(ValueError, match=r"an input of shape \(4, \d+, 24\) was resized to \d+ "
                                         r"along seq_dim and is still 24 long") as e:
        memfit.find_batch_size(PairwiseMasked(), {"x": x, "mask": mask}, x.clone(),
                               loss_fn=token_loss, optimizer="sgd", budget=8 << 20, seq_dim=1,
                               lengths=lengths)
    assert "position embeddings" not in str(e.value)
