"""Validation loaders passed to fit(): Lightning runs them, at their own
batch, instead of any val_dataloader. FitBatchSize did not check them and
said 556, silently, where a validation_step of 8 test-time augmentations
at their batch of 160 runs out of memory beside Adam's state at any
training batch (136 runs). Their batch cannot be changed: FitBatchSize
says so in one line (See Note [The validation inside the fit loop],
integrations/lightning_rehearsal.py). The truth is Lightning's own loop on
a simulated device."""

import gc

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit._native import tracked_live_bytes

pl = pytest.importorskip("lightning.pytorch")
from lightning_setup import BUDGET, DATA, Classifier, quiet_trainer  # noqa: E402
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py



class Augmented(Classifier):
    """Validated with 8 augmentations of each batch; a val_dataloader of its
    own, which fit()'s loaders replace."""

    def __init__(self, batch_size=4):
        super().__init__(batch_size)
        self.validated = []

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.validated.append(len(x))
        xs = torch.cat([x, -x, x * 0.5, x * 2, x + 1, x - 1, x.flip(1), -x.flip(1)])
        self.log("val_loss", F.cross_entropy(self.net(xs).view(8, len(x), -1).mean(0), y))

    def val_dataloader(self):
        return torch.utils.data.DataLoader(DATA, batch_size=1)


def _fit(batch_size, val_batch, callbacks=()):
    """Four training steps, validating 2 batches of fit()'s loader after the
    second and the fourth (and 2 before training)."""
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        module = Augmented(batch_size)
        quiet_trainer(max_steps=4,
                      val_check_interval=2, limit_val_batches=2, num_sanity_val_steps=2,
                      callbacks=list(callbacks)).fit(
                          module, val_dataloaders=torch.utils.data.DataLoader(DATA, val_batch))
    return module


def test_a_passed_validation_batch_that_cannot_fit_is_refused_in_one_line():
    with pytest.raises(torch.OutOfMemoryError):
        _fit(1, 160)  # Lightning's loop, at any training batch
    with pytest.raises(memfit.DoesNotFit, match=r"^\[FitBatchSize\] validation_step runs out of "
                       r"memory at the batch of 160 of the val_dataloaders passed to fit\(\)"):
        _fit(4, 160, [FitBatchSize()])


def test_a_passed_validation_batch_that_fits_keeps_the_training_batch():
    fit = FitBatchSize()
    module = _fit(4, 128, [fit])  # Lightning's loop at the batch set: an OOM would raise
    assert module.validated == [128] * 6 and module.batch_size == fit.optimal_batch_size > 4


def test_training_loaders_passed_to_fit_are_refused_in_one_line():
    # Lightning runs them instead of train_dataloader: the batch set to the
    # module was read by nothing, silently.
    module = Augmented(4)
    trainer = quiet_trainer(max_steps=1,
                            limit_val_batches=0, callbacks=[FitBatchSize(budget="8MiB")])
    with pytest.raises(ValueError, match=r"^\[FitBatchSize\] train_dataloaders were passed to "
                       r"fit\(\): their batch is fixed"):
        trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(DATA, batch_size=8))
