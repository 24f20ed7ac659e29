"""A training_step that reads self.trainer (the epoch, for a schedule) and
writes through self.logger: FitBatchSize rehearses it on a copy of the
module, which Lightning's copying leaves without a trainer, so the
rehearsal raised "not attached to a `Trainer`" where Lightning's loop
trains. The copy sees the trainer, with loggers that write nowhere: the
rehearsal writes no row the run without FitBatchSize does not (See Note
[Rehearsed on a copy of the module], integrations/lightning_rehearsal.py).
The truth is Lightning's own loop on a simulated device of the budget."""

import gc

import pytest

import memfit
from memfit._native import tracked_live_bytes

pl = pytest.importorskip("lightning.pytorch")
import lightning_setup as setup  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py


class ReadsTheTrainer(setup.Classifier):
    def training_step(self, batch, batch_idx):
        warm = min(1.0, (self.trainer.current_epoch + 1) / 2)  # a warm-up by epoch
        if batch_idx == 0:
            self.logger.log_metrics({"first_batch": float(self.global_step)},
                                    step=self.global_step)
        return warm * super().training_step(batch, batch_idx)


def train(path, batch_size, callbacks=()):
    """Lightning's loop on the device, logging to a CSV file under `path`;
    (the batch it ran, the file's text)."""
    gc.collect()
    with memfit.simulated_device(setup.BUDGET + tracked_live_bytes("cpu")):
        module = ReadsTheTrainer(batch_size)
        pl.Trainer(accelerator="cpu", devices=1, logger=CSVLogger(path, name="run"),
                   enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, max_epochs=2, limit_train_batches=2,
                   log_every_n_steps=1, callbacks=list(callbacks)).fit(module)
    return module.batch_size, (path / "run" / "version_0" / "metrics.csv").read_text()


def test_a_step_reading_the_trainer_is_rehearsed_and_writes_nothing(tmp_path):
    fit = FitBatchSize()
    batch, fitted = train(tmp_path / "fitted", 4, [fit])  # an OOM would raise
    assert batch == fit.optimal_batch_size > 4
    fit = None
    _, plain = train(tmp_path / "plain", batch)  # Lightning's loop alone, at the batch set
    assert fitted == plain
    assert fitted.count("\n") == 3  # the header and the two epochs' first batches
