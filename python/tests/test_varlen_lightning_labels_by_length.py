"""Lightning's FitBatchSize(lengths=) on sequence-to-sequence samples:
sources of 16 tokens, targets padded apart from them, one longer than the
rest. The fit per length resized input_ids alone and kept the first
batch's short targets; Lightning's own loop at the batch it said fits, every
target that long, ran out of memory. The truth is Lightning's own loop on a
simulated device of the budget."""

import pytest
import torch
import torch.nn.functional as F

pl = pytest.importorskip("lightning.pytorch")
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

from lightning_setup import fit_on_device  # noqa: E402

VOCAB, N, SOURCE, TARGET, LONG_TARGET, D = 64, 128, 16, 8, 256, 64
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


def pairs(target=None):
    """Targets of TARGET tokens, the last one LONG_TARGET (or every one `target`)."""
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(0, VOCAB, (SOURCE,), generator=g),
             "labels": torch.randint(0, VOCAB, (target or (LONG_TARGET if i == N - 1 else
                                                           TARGET),), generator=g)}
            for i in range(N)]


def pad(batch):
    def padded(key, value):
        return torch.nn.utils.rnn.pad_sequence([s[key] for s in batch], batch_first=True,
                                               padding_value=value)
    return {"input_ids": padded("input_ids", 0), "labels": padded("labels", -100)}


class Translator(pl.LightningModule):
    """The source's mean, and each target position's own embedding, to the
    vocabulary."""

    def __init__(self, batch_size, data):
        super().__init__()
        torch.manual_seed(0)
        self.batch_size, self.data = batch_size, data
        self.src, self.pos = torch.nn.Embedding(VOCAB, D), torch.nn.Embedding(LONG_TARGET, D)
        self.net = torch.nn.Sequential(torch.nn.Linear(D, 4 * D), torch.nn.GELU(),
                                       torch.nn.Linear(4 * D, VOCAB))

    def training_step(self, batch, batch_idx):
        labels = batch["labels"]
        h = self.src(batch["input_ids"]).mean(1, keepdim=True) + self.pos(
            torch.arange(labels.shape[1], device=labels.device))
        return F.cross_entropy(self.net(h).flatten(0, 1), labels.flatten())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters())

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.data, batch_size=self.batch_size,
                                           collate_fn=pad)


def test_each_length_is_fitted_with_the_longest_target():
    data, longest = pairs(), pairs(LONG_TARGET)  # on the host, as a card's loader holds them
    fit = FitBatchSize(seq_dim={"input_ids": 1}, lengths=[SOURCE])
    fit_on_device(lambda b: Translator(b, data), 8, [fit], max_steps=1)
    batch = fit.length_fit.at(SOURCE)
    assert fit_on_device(lambda b: Translator(b, longest), batch, max_steps=2) == batch
