"""A train_dataloader returning a dict of loaders, or a CombinedLoader:
Lightning's loop hands training_step a batch of each loader, in that
structure. FitBatchSize took the dict's first key for a batch ("expected a
tensor ... got str") and the CombinedLoader's (batch, batch_idx,
dataloader_idx) tuple for one (training_step raised); it draws the first
batch as the loop does (See _first_of, integrations/lightning.py). The
truth is Lightning's own loop on a simulated device."""

import gc

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit._native import tracked_live_bytes

pl = pytest.importorskip("lightning.pytorch")
from lightning_setup import BUDGET, DATA, quiet_trainer  # noqa: E402
from lightning.pytorch.utilities import CombinedLoader  # noqa: E402
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py



class TwoSources(pl.LightningModule):
    """One loss over a batch of each of two loaders, {"a": ..., "b": ...}."""

    def __init__(self, batch_size=4):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(),
                                       torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                       torch.nn.Linear(512, 10))
        self.batch_size = batch_size
        self.sizes = []

    def training_step(self, batch, batch_idx):
        self.sizes.append((len(batch["a"][0]), len(batch["b"][0])))
        return sum(F.cross_entropy(self.net(x), y) for x, y in (batch["a"], batch["b"]))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters())

    def train_dataloader(self):
        return {k: torch.utils.data.DataLoader(DATA, batch_size=self.batch_size, shuffle=True)
                for k in "ab"}


class Combined(TwoSources):
    def train_dataloader(self):
        return CombinedLoader(super().train_dataloader(), mode="max_size_cycle")


def _fit(make, batch_size, callbacks=()):
    gc.collect()
    left = tracked_live_bytes("cpu")
    with memfit.simulated_device(BUDGET + left):
        module = make(batch_size)
        quiet_trainer(max_steps=3,
                      callbacks=list(callbacks)).fit(module)
    return module


@pytest.mark.parametrize("make", [TwoSources, Combined], ids=["dict", "CombinedLoader"])
def test_the_batch_fitted_to_two_loaders_runs_lightnings_loop_and_is_tight(make):
    fit = FitBatchSize()
    module = _fit(make, 4, [fit])
    b = fit.optimal_batch_size
    # The loop's 3 steps (the rehearsal's are not the module's), each a
    # batch of b from each loader, with no OOM.
    assert module.sizes == [(b, b)] * 3
    module = None
    # Tight: Lightning's loop runs out of memory 3% above it.
    with pytest.raises(torch.OutOfMemoryError):
        _fit(make, b + max(2, b // 33))
