"""Lightning's FitBatchSize with a collate_fn that cuts each sample into
windows of W tokens: a sample of 4 W tokens gives 4 rows of W, the first
batch's short samples a row each. The scan of the training samples resized
the example to the longest sample, 4 W, past the module's W positions:
IndexError inside memfit, where Lightning's loop trains. Now the longest
sample is collated alone and its rows are the rows a sample may give. The
truth is Lightning's own loop on a simulated device of the budget, every
sample that long."""

import pytest
import torch
import torch.nn.functional as F

pl = pytest.importorskip("lightning.pytorch")
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

from lightning_setup import fit_on_device  # noqa: E402

VOCAB, N, W, WINDOWS, D = 64, 256, 16, 4, 64
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


def texts(only=None):
    """Samples of W tokens, the last one WINDOWS x W (or every one `only`)."""
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, VOCAB, (only or (WINDOWS * W if i == N - 1 else W),), generator=g)
            for i in range(N)]


def windows(samples):
    """Each sample cut into rows of W tokens, the last one padded."""
    rows = [F.pad(w, (0, W - len(w))) for s in samples for w in s.split(W)]
    return torch.stack(rows)


class Tagger(pl.LightningModule):
    """A token's embedding plus its position's (W positions), two layers."""

    def __init__(self, batch_size, data):
        super().__init__()
        torch.manual_seed(0)
        self.batch_size, self.data = batch_size, data
        self.tok, self.pos = torch.nn.Embedding(VOCAB, D), torch.nn.Embedding(W, D)
        self.net = torch.nn.Sequential(torch.nn.Linear(D, 4 * D), torch.nn.GELU(),
                                       torch.nn.Linear(4 * D, VOCAB))

    def training_step(self, batch, batch_idx):
        h = self.tok(batch) + self.pos(torch.arange(batch.shape[1], device=batch.device))
        return F.cross_entropy(self.net(h).flatten(0, 1), batch.flatten())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters())

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.data, batch_size=self.batch_size,
                                           collate_fn=windows)


def test_the_batch_counts_the_rows_the_longest_sample_gives():
    fit = FitBatchSize()
    batch = fit_on_device(lambda b: Tagger(b, texts()), N, [fit], max_steps=1)
    assert any(f"{WINDOWS} rows of {W}" in note for note in fit.plan.notes), fit.plan.notes
    assert fit_on_device(lambda b: Tagger(b, texts(WINDOWS * W)), batch, max_steps=2) == batch
