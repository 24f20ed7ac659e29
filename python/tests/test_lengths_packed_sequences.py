"""A model that packs its batch (pack_padded_sequence, each sample's length
given beside the tokens) runs only each sample's own tokens: a fit per
length sets that lengths tensor to each fitted length, so a batch padded to
L whose samples are all L long runs there. The truth is plain training
steps on a simulated device of the budget, not memfit."""

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import memfit
from memfit.testing.truth import loop_body, plain_steps_run

BUDGET = 2 << 20
VOCAB = 50


class PackedLSTM(torch.nn.Module):
    def __init__(self, d=16):
        super().__init__()
        torch.manual_seed(0)
        self.tok = torch.nn.Embedding(VOCAB, d)
        self.rnn = torch.nn.LSTM(d, 2 * d, batch_first=True)
        self.head = torch.nn.Linear(2 * d, VOCAB)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(self.tok(x), lengths, batch_first=True,
                                      enforce_sorted=False)
        out, _ = pad_packed_sequence(self.rnn(packed)[0], batch_first=True,
                                     total_length=x.shape[1])
        return self.head(out)


def token_loss(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten(), ignore_index=-100)


def example():
    """Four samples padded to 12, the longest 12."""
    lengths = torch.tensor([12, 5, 3, 2])
    x = torch.randint(1, VOCAB, (4, 12)) * (torch.arange(12) < lengths[:, None])
    return {"x": x, "lengths": lengths}, x.clone()


def runs(batch, length, budget=BUDGET):
    """Plain steps (the quickstart loop) on `batch` samples all `length` long."""
    def build():
        model = PackedLSTM()
        x = torch.randint(1, VOCAB, (batch, length))
        batch_in = {"x": x, "lengths": torch.full((batch,), length)}
        return model, torch.optim.Adam(model.parameters(), lr=1e-3), batch_in, x.clone(), {}

    def step(model, opt, x, y, kept):
        loop_body(lambda b: model(**b), opt, x, y, token_loss, kept)
    return plain_steps_run(budget, build, step)


def test_a_packed_batch_is_fitted_with_every_sample_as_long_as_the_length():
    torch.manual_seed(0)
    x, y = example()
    # Cut to 8 the example's lengths (12) raised in pack_padded_sequence;
    # repeated to 32 they still ran 12 tokens per sample, and at(32) ran out.
    fit = memfit.find_batch_size(PackedLSTM(), x, y, loss_fn=token_loss, optimizer="adam",
                                 budget=BUDGET, seq_dim=1, lengths=[8, 32])
    assert any("each sample's length read from lengths (4,)" in n for n in fit.notes), fit.notes
    for n in (9, 21, 32):
        assert runs(fit.at(n), n), (n, fit.at(n))
    assert not runs(fit.at(32) * 5 // 4, 32)  # close to what fits, not far below


def test_every_length_between_the_measured_ones_runs():
    # Its peak is not convex in the length: at 1.5 MiB the chord between 8
    # and 32 ran 0.1-1.6% under the steps between, and at(21) = 21 ran out
    # by 140 B where the checks at 9 and 20 fit.
    budget = 3 << 19
    torch.manual_seed(0)
    x, y = example()
    fit = memfit.find_batch_size(PackedLSTM(), x, y, loss_fn=token_loss, optimizer="adam",
                                 budget=budget, seq_dim=1, lengths=[8, 32])
    assert [n for n in range(9, 32, 2) if not runs(fit.at(n), n, budget)] == []
