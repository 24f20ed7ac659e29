"""Lightning's FitBatchSize measures training_step on the batch as
Lightning's loop hands it over: cast by a "true" precision plugin
(precision="bf16-true" casts floating-point inputs to bf16) and passed
through the module's on_before_batch_transfer hook. Given the loader's
batch as it is, a "bf16-true" module's training_step raised (float32 inputs
into bf16 weights) where Lightning's loop trains. The truth is Lightning's
own loop on the simulated device."""

import gc

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit._native import tracked_live_bytes

pl = pytest.importorskip("lightning.pytorch")
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

BUDGET = 8 << 20
X = torch.randn(512, 64, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 10, (512,), generator=torch.Generator().manual_seed(1))

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py


class Samples(torch.utils.data.Dataset):
    def __init__(self, x):
        self.x = x

    def __len__(self):
        return 1 << 16

    def __getitem__(self, i):
        return self.x[i % len(X)], Y[i % len(X)]


class Wide(pl.LightningModule):
    def __init__(self, batch_size=4):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(),
                                       torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                       torch.nn.Linear(512, 10))
        self.batch_size = batch_size

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters())

    def train_dataloader(self):
        return torch.utils.data.DataLoader(Samples(X), batch_size=self.batch_size)


# The samples as bytes, made once on the host as a card's loader holds them.
# Made inside train_dataloader they sat on the simulated device (32 KiB)
# beside every step of Lightning's loop, though not yet when FitBatchSize
# sized the batch: a dataset the loader builds on the device later is not
# counted (on a card, one built there with .cuda() would not be either).
X_BYTES = ((X - X.min()) / (X.max() - X.min()) * 255).to(torch.uint8)


class Bytes(Wide):
    """Samples stored as uint8, made floats by on_before_batch_transfer."""

    def train_dataloader(self):
        return torch.utils.data.DataLoader(Samples(X_BYTES), batch_size=self.batch_size)

    def on_before_batch_transfer(self, batch, dataloader_idx):
        x, y = batch
        return x.float() / 255, y


def _trainer(callbacks=(), **kw):
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, max_steps=3,
                      callbacks=list(callbacks), **kw)


def _loop_runs(make, batch, **kw):
    gc.collect()
    left = tracked_live_bytes("cpu")
    try:
        with memfit.simulated_device(BUDGET + left):
            _trainer(**kw).fit(make(batch))
        return True
    except torch.OutOfMemoryError:
        return False


# bf16's samples are light beside its fixed part (764 B a sample against
# 8 MB: 10% more samples is 1% more memory), and memfit's answer there is
# 1298 where the loop runs 1439: tight to the memory, not to 3% of the
# batch. So its check is 15% above.
@pytest.mark.parametrize("make,kw,above", [(Wide, dict(precision="bf16-true"), 0.15),
                                           (Bytes, {}, 0.03)],
                         ids=["bf16-true", "on_before_batch_transfer"])
def test_the_fitted_batch_runs_lightnings_loop_and_is_tight(make, kw, above):
    gc.collect()
    with memfit.simulated_device(BUDGET):
        fit = FitBatchSize()
        _trainer([fit], **kw).fit(make())
    b = fit.optimal_batch_size
    assert _loop_runs(make, b, **kw), f"Lightning's loop ran out of memory at {b}"
    more = b + max(2, int(b * above))
    assert not _loop_runs(make, more, **kw), f"Lightning's loop ran at {more} too: not tight"
