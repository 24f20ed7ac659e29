"""What the Lightning tests share: a budget, data made on the host before
any simulated device (as a card's loader holds it), a quiet Trainer, and a
64-512-512-10 classifier trained with Adam on it, which each test's module
extends."""

import gc

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit._native import tracked_live_bytes

pl = pytest.importorskip("lightning.pytorch")

BUDGET = 8 << 20
X = torch.randn(512, 64, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 10, (512,), generator=torch.Generator().manual_seed(1))
DATA = torch.utils.data.TensorDataset(X.repeat(8, 1), Y.repeat(8))  # made before the device


def quiet_trainer(**kw):
    """Lightning's Trainer on the CPU, one device, with nothing written or
    printed (no logger, checkpoints, progress bar or summary)."""
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, **kw)


def fit_on_device(make, batch_size, callbacks=(), **flags):
    """Lightning's loop (quiet_trainer(**flags).fit) on a simulated device
    of BUDGET, beside what earlier tests left tracked, the module
    make(batch_size) made on it; returns the batch it trained at. An OOM
    there raises torch.OutOfMemoryError."""
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        module = make(batch_size)
        quiet_trainer(callbacks=list(callbacks), **flags).fit(module)
    return module.batch_size


class Classifier(pl.LightningModule):
    """64-512-512-10 with Adam over DATA, batch_size read by its loader."""

    def __init__(self, batch_size=4):
        super().__init__()
        torch.manual_seed(0)
        self.batch_size = batch_size
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(),
                                       torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                       torch.nn.Linear(512, 10))

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters())

    def train_dataloader(self):
        return torch.utils.data.DataLoader(DATA, batch_size=self.batch_size)
