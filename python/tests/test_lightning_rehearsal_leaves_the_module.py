"""FitBatchSize rehearses training_step (probes, verifying steps) before the
fit loop starts; what the step does besides computing the loss must not
reach the user's module. Lightning's own docs keep each step's loss in a
list for on_train_epoch_end: the rehearsal's 18 steps were left in it
beside the loop's 3 (and in a counter of steps), and the epoch's mean
took them in. They run on a copy of the module sharing its weights (See
Note [Rehearsed on a copy of the module], integrations/lightning.py)."""

import pytest
import torch
import torch.nn.functional as F

pl = pytest.importorskip("lightning.pytorch")
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py

X = torch.randn(512, 64, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 10, (512,), generator=torch.Generator().manual_seed(1))
DATA = torch.utils.data.TensorDataset(X.repeat(8, 1), Y.repeat(8))


class KeepsLosses(pl.LightningModule):
    def __init__(self, batch_size=4):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                       torch.nn.Linear(256, 10))
        self.batch_size = batch_size
        self.training_step_outputs = []
        self.steps = 0
        self.epoch_means = []

    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self.net(batch[0]), batch[1])
        self.training_step_outputs.append(loss.detach())
        self.steps += 1
        return loss

    def on_train_epoch_end(self):
        self.epoch_means.append(torch.stack(self.training_step_outputs).mean().item())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters())

    def train_dataloader(self):
        return torch.utils.data.DataLoader(DATA, batch_size=self.batch_size)


def _fit(module, callbacks=()):
    pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, max_epochs=1,
               limit_train_batches=3, callbacks=list(callbacks)).fit(module)
    return module


def test_the_rehearsed_steps_leave_nothing_in_the_modules_own_state():
    fit = FitBatchSize(budget="2MiB")
    fitted = _fit(KeepsLosses(), [fit])
    assert fit.plan.full_size_steps >= 1  # it rehearsed steps
    plain = _fit(KeepsLosses(fit.optimal_batch_size))
    assert fitted.steps == plain.steps == 3
    assert len(fitted.training_step_outputs) == 3
    # The same three losses, so the same epoch mean, as without the callback.
    assert torch.equal(torch.stack(fitted.training_step_outputs),
                       torch.stack(plain.training_step_outputs))
    assert fitted.epoch_means == plain.epoch_means


def test_memory_reports_rehearsed_step_leaves_nothing_either(tmp_path):
    from memfit.integrations.lightning import MemoryReport

    module = _fit(KeepsLosses(8), [MemoryReport(str(tmp_path / "step.html"), predict=False)])
    assert module.steps == 3 and len(module.training_step_outputs) == 3
