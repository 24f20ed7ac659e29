"""Lightning's FitBatchSize on samples that are dicts whose first entry is
a class label ({"label": 1, "tokens": [...]}), padded per batch by their
collate_fn. The scan of the training samples read each sample's first
entry, found a number, and gave up without a word: the batch fitted on the
first batch's short samples ran Lightning's loop out of memory at the
longest. Now the entry read is input_ids, else the one with the most
dimensions. The truth is Lightning's own loop on a simulated device of the
budget, every sample that long."""

import pytest
import torch
import torch.nn.functional as F

pl = pytest.importorskip("lightning.pytorch")
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

from lightning_setup import fit_on_device  # noqa: E402

VOCAB, N, SHORT, LONG, D = 64, 256, 8, 128, 64
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


def samples(only=None):
    """SHORT tokens each, the last sample LONG (or every one `only`)."""
    g = torch.Generator().manual_seed(0)
    return [{"label": i % 2, "tokens": torch.randint(
        0, VOCAB, (only or (LONG if i == N - 1 else SHORT),), generator=g)} for i in range(N)]


def pad(batch):
    return {"label": torch.tensor([s["label"] for s in batch]),
            "tokens": torch.nn.utils.rnn.pad_sequence([s["tokens"] for s in batch],
                                                      batch_first=True)}


class Classifier(pl.LightningModule):
    def __init__(self, batch_size, data):
        super().__init__()
        torch.manual_seed(0)
        self.batch_size, self.data = batch_size, data
        self.tok = torch.nn.Embedding(VOCAB, D)
        self.net = torch.nn.Sequential(torch.nn.Linear(D, 4 * D), torch.nn.GELU(),
                                       torch.nn.Linear(4 * D, D))
        self.head = torch.nn.Linear(D, 2)

    def training_step(self, batch, batch_idx):
        h = self.net(self.tok(batch["tokens"])).mean(1)
        return F.cross_entropy(self.head(h), batch["label"])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters())

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.data, batch_size=self.batch_size,
                                           collate_fn=pad)


def test_the_scan_reads_the_tokens_past_a_label():
    data, longest = samples(), samples(LONG)  # on the host, as a card's loader holds them
    fit = FitBatchSize()
    batch = fit_on_device(lambda b: Classifier(b, data), 64, [fit], max_steps=1)
    assert any(f"a training sample {LONG}" in note for note in fit.plan.notes), fit.plan.notes
    assert fit_on_device(lambda b: Classifier(b, longest), batch, max_steps=2) == batch
