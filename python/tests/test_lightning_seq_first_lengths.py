"""Each sample's length, read for a LengthBatchSampler, along the dimension
that is seq_dim in a batch: a sample has no batch dimension, so seq_dim
moves down one only where the batch dimension comes before it. A
seq-first loop (batch_dim=1, seq_dim=0) of (L, features) samples read
each length along the features (seq_dim - 1 = -1): 8 for every sample,
and Lightning's first batch, 103 steps long with the 33 samples that fit
at 8, ran out of memory. The truth is Lightning's own loop on a simulated
device of the budget."""

import gc
import math

import pytest
import torch

import memfit
from memfit.integrations.length_batches import sample_lengths

pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py

FEATURES, CLASSES = 8, 10
_g = torch.Generator().manual_seed(0)
LENGTHS = [int(v) for v in torch.empty(300).log_normal_(math.log(20), 0.8, generator=_g)
           .clamp(4, 128).round()]
POOL = [(torch.randn(n, FEATURES, generator=_g), torch.randint(0, CLASSES, (n,), generator=_g))
        for n in LENGTHS]


def test_a_samples_length_is_read_along_its_own_dimension_of_seq_dim():
    frames = [torch.zeros(n, FEATURES) for n in (5, 9)]
    assert sample_lengths(frames, 1, None, "t") == [5, 9]  # (B, L, F)
    assert sample_lengths(frames, 0, None, "t", batch_dim=1) == [5, 9]  # (L, B, F)
    audio = [torch.zeros(2, n) for n in (30, 70)]  # (B, channels, T)
    assert sample_lengths(audio, -1, None, "t") == [30, 70]
    assert sample_lengths(audio, 2, None, "t") == [30, 70]
    with pytest.raises(ValueError, match="pass sample_lengths="):
        sample_lengths(frames, 1, None, "t", batch_dim=1)  # the batch's own dimension


def pad_seq_first(samples):
    x = torch.nn.utils.rnn.pad_sequence([s[0] for s in samples])  # (L, B, F)
    y = torch.nn.utils.rnn.pad_sequence([s[1] for s in samples], padding_value=-100)
    return x, y


@pytest.mark.slow
def test_lightning_seq_first_batches_by_each_samples_length_and_runs_with_no_oom():
    pl = pytest.importorskip("lightning.pytorch")
    from memfit.integrations.lightning import FitBatchSize

    class Tagger(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.inp = torch.nn.Linear(FEATURES, 64)
            self.lstm = torch.nn.LSTM(64, 64)  # seq-first
            self.head = torch.nn.Linear(64, CLASSES)
            self.shapes = []

        def on_train_batch_start(self, batch, batch_idx):
            self.shapes.append(tuple(batch[0].shape[:2]))

        def training_step(self, batch, batch_idx):
            x, y = batch
            out = self.head(self.lstm(self.inp(x))[0])
            return torch.nn.functional.cross_entropy(out.flatten(0, 1), y.flatten(),
                                                     ignore_index=-100)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(POOL, batch_size=8, shuffle=True,
                                               collate_fn=pad_seq_first)

    module = Tagger()
    fit = FitBatchSize(batch_dim=1, seq_dim=0, lengths=[16, 64, 128])
    gc.collect()
    with memfit.simulated_device("4MiB"):
        trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, max_steps=12,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, callbacks=[fit])
        trainer.fit(module)  # an OOM would raise
    assert fit.sampler.lengths == LENGTHS
    assert trainer.global_step == 12
    for n, b in module.shapes:
        assert b <= fit.length_fit.at(n), (n, b)
