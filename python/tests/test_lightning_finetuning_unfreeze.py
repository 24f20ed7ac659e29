"""A BaseFinetuning callback freezes the backbone before configure_optimizers
and unfreezes it at a later epoch: FitBatchSize, run on_fit_start, saw a step
training the head only and set 1605 samples, where Lightning's loop ran out
of memory once the backbone trained (epoch 1; 557 at most). The batch is
measured as after the unfreezing (See Note [Layers a finetuning callback
unfreezes later], integrations/lightning.py). The truth is Lightning's own
loop, with the callback, on a simulated device of the budget."""

import gc

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit._native import tracked_live_bytes

pl = pytest.importorskip("lightning.pytorch")
from lightning_setup import BUDGET, DATA, quiet_trainer  # noqa: E402
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py



class FineTuned(pl.LightningModule):
    """A 64-512-512 backbone (frozen at first) under a 512-10 head."""

    def __init__(self, batch_size=4):
        super().__init__()
        torch.manual_seed(0)
        self.backbone = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(),
                                            torch.nn.Linear(512, 512), torch.nn.ReLU())
        self.head = torch.nn.Linear(512, 10)
        self.batch_size = batch_size

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.head(self.backbone(batch[0])), batch[1])

    def configure_optimizers(self):
        return torch.optim.Adam(p for p in self.parameters() if p.requires_grad)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(DATA, batch_size=self.batch_size)


class UnfreezeAtEpoch1(pl.callbacks.BaseFinetuning):
    def freeze_before_training(self, pl_module):
        self.freeze(pl_module.backbone)

    def finetune_function(self, pl_module, epoch, optimizer):
        if epoch == 1:
            self.unfreeze_and_add_param_group(pl_module.backbone, optimizer)


class Seen(pl.Callback):
    """What the loop starts with (after FitBatchSize), and each step's batch."""

    def __init__(self):
        self.sizes, self.start = [], None

    def on_train_start(self, trainer, module):
        self.start = (len(trainer.optimizers[0].param_groups), len(trainer.optimizers[0].state),
                      [p.requires_grad for p in module.parameters()])

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.sizes.append(batch[0].shape[0])


def _fit(batch_size, callbacks):
    """Two epochs of two steps of Lightning's loop on the simulated device."""
    gc.collect()
    left = tracked_live_bytes("cpu")
    with memfit.simulated_device(BUDGET + left):
        module = FineTuned(batch_size)
        quiet_trainer(max_epochs=2,
                      limit_train_batches=2, callbacks=[*callbacks, UnfreezeAtEpoch1()]
                      ).fit(module)
    return module


def test_the_batch_fitted_before_the_unfreezing_runs_the_epochs_after_it():
    fit, seen = FitBatchSize(), Seen()
    module = _fit(4, [fit, seen])
    b = fit.optimal_batch_size
    # Epoch 1 trained the backbone too, at the fitted batch, with no OOM.
    assert all(p.requires_grad for p in module.parameters())
    assert seen.sizes == [b] * 4
    # The loop started as the user set it: the backbone frozen, one param
    # group, no optimizer state (the rehearsal's unfreezing put back).
    assert seen.start == (1, 0, [False] * 4 + [True] * 2)
    assert any("as after UnfreezeAtEpoch1 unfreezes them" in n for n in fit.plan.notes)
    module = None
    # Tight: Lightning's loop runs out of memory 3% above it (at epoch 1).
    with pytest.raises(torch.OutOfMemoryError):
        _fit(b + max(2, b // 33), [])
