"""Lightning's FitBatchSize without lengths= on seq-first data padded per
batch (batch_dim=1: (L, B, features)): the scan of the training samples for
one longer than the first batch ran only for batch_dim=0, so the batch was
fitted at the first batch's 10 steps (50 samples) and Lightning's own step
on the 128-step sample ran out of memory. The truth is Lightning's own
loop on a simulated device of the budget, every sample that long."""

import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

pl = pytest.importorskip("lightning.pytorch")
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py
FEATURES, CLASSES, SHORT, LONG = 8, 10, 10, 128
BUDGET = 4 << 20


def samples(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, FEATURES, generator=g), torch.randint(0, CLASSES, (n,), generator=g))
            for n in lengths]


def pad_seq_first(batch):
    return (torch.nn.utils.rnn.pad_sequence([s[0] for s in batch]),
            torch.nn.utils.rnn.pad_sequence([s[1] for s in batch], padding_value=-100))


class Tagger(pl.LightningModule):
    def __init__(self, pool, batch_size=8):
        super().__init__()
        torch.manual_seed(0)
        self.pool, self.batch_size = pool, batch_size
        self.inp = torch.nn.Linear(FEATURES, 64)
        self.lstm = torch.nn.LSTM(64, 64)  # seq-first
        self.head = torch.nn.Linear(64, CLASSES)

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.head(self.lstm(self.inp(x))[0])
        return torch.nn.functional.cross_entropy(out.flatten(0, 1), y.flatten(),
                                                 ignore_index=-100)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.pool, batch_size=self.batch_size,
                                           collate_fn=pad_seq_first)


def trainer(steps, callbacks=()):
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, max_steps=steps,
                      enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=list(callbacks))


def test_a_seq_first_batch_is_fitted_at_the_longest_sample_and_lightnings_steps_run_it():
    module = Tagger(samples([SHORT] * 299 + [LONG]))
    fit = FitBatchSize(batch_dim=1)
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        trainer(1, [fit]).fit(module)
    batch = module.batch_size
    assert any(f"a training sample {LONG}" in n and "seq_dim=0" in n for n in fit.plan.notes), \
        fit.plan.notes
    module = fit = None
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        trainer(2).fit(Tagger(samples([LONG] * 2 * batch, seed=1), batch))  # an OOM would raise
