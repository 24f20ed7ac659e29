"""Lightning's FitBatchSize on data padded per batch (a collate function
that pads to the batch's longest sample): the first batch it measures is
only as long as its samples, and the batch it sets must still run
Lightning's own loop on the longest samples of the training set."""

import gc
import math

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit._native import tracked_live_bytes

pl = pytest.importorskip("lightning.pytorch")
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

VOCAB, SHORT, LONG, N, BUDGET = 100, 12, 64, 1024, 16 << 20


pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py


def samples(only=None):
    """SHORT tokens each, but for the last sample, LONG (or all `only`)."""
    g = torch.Generator().manual_seed(0)
    return [torch.randint(1, VOCAB, (only or (LONG if i == N - 1 else SHORT),), generator=g)
            for i in range(N)]


class Attention(pl.LightningModule):
    """Token embeddings and one eager attention layer: scores of length^2."""

    def __init__(self, data, d=32, heads=4):
        super().__init__()
        torch.manual_seed(0)
        self.data, self.heads, self.batch_size = data, heads, 32
        self.tok = torch.nn.Embedding(VOCAB, d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.head = torch.nn.Linear(d, VOCAB)

    def training_step(self, x, batch_idx):
        b, n = x.shape
        q, k, v = self.qkv(self.tok(x)).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).softmax(-1)
        out = self.head((scores @ v).transpose(1, 2).reshape(b, n, -1))
        return F.cross_entropy(out.flatten(0, 1), x.flatten())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters())

    def train_dataloader(self):
        return torch.utils.data.DataLoader(
            self.data, batch_size=self.batch_size, shuffle=True,
            collate_fn=lambda s: torch.nn.utils.rnn.pad_sequence(s, batch_first=True))


def trainer(callbacks=(), steps=None):
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, max_epochs=1,
                      max_steps=steps or -1, callbacks=list(callbacks))


def test_the_batch_fitted_on_a_short_first_batch_runs_the_longest_samples():
    short, long = samples(), samples(only=LONG)  # on the host, beside the device
    gc.collect()
    fit = FitBatchSize()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        trainer([fit], steps=1).fit(Attention(short))
    batch = fit.optimal_batch_size
    assert any(f"a training sample {LONG}" in note for note in fit.plan.notes), fit.plan.notes
    fit = None
    # The truth: Lightning's own loop at that batch, every sample LONG.
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        module = Attention(long)
        module.batch_size = batch
        trainer(steps=2).fit(module)  # an out-of-memory error fails the test
