"""configure_optimizers reading trainer.estimated_stepping_batches (OneCycleLR's
total steps) makes Lightning build the training loader before on_fit_start,
at the user's batch, and the loop kept it: FitBatchSize said 556 and
Lightning's loop trained at 4 (See Note [A loader built before the fit
starts], integrations/lightning.py). The truth is the batch Lightning's own
loop hands training_step, on a simulated device of the budget."""

import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

pl = pytest.importorskip("lightning.pytorch")
import lightning_setup as setup  # noqa: E402
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py


class OneCycle(setup.Classifier):
    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters())
        steps = self.trainer.estimated_stepping_batches  # builds the training loader
        return {"optimizer": opt, "lr_scheduler": {
            "scheduler": torch.optim.lr_scheduler.OneCycleLR(opt, 1e-2, total_steps=steps),
            "interval": "step"}}


class Sizes(pl.Callback):
    def __init__(self):
        self.sizes = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.sizes.append(batch[0].shape[0])


def test_the_loop_trains_at_the_batch_set_where_its_loader_was_built_before():
    gc.collect()
    fit, sizes = FitBatchSize(), Sizes()
    with memfit.simulated_device(setup.BUDGET + tracked_live_bytes("cpu")):
        module = OneCycle(4)
        setup.quiet_trainer(max_epochs=1, limit_train_batches=3,
                            callbacks=[fit, sizes]).fit(module)  # no OOM
    assert fit.optimal_batch_size > 4
    assert sizes.sizes == [fit.optimal_batch_size] * 3
    assert any(n.startswith("the training loader was built before the fit started")
               for n in fit.plan.notes), fit.plan.notes
