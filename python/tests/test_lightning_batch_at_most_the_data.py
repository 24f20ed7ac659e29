"""Lightning's FitBatchSize sets a batch no larger than the training set, as
Lightning's own BatchSizeFinder does: a 1000-sample set under a 64 MiB
budget got the 687689 samples that fit, and with drop_last=True its loader
had no batch at all: training ran no step, silently."""

import pytest
import torch
import torch.nn.functional as F

import memfit

pl = pytest.importorskip("lightning.pytorch")
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py

X = torch.randn(1000, 16, generator=torch.Generator().manual_seed(0))
Y = torch.zeros(1000, dtype=torch.long)


class Small(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(16, 2)
        self.batch_size = 8
        self.steps = 0

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.lin(batch[0]), batch[1])

    def on_train_batch_end(self, *args):
        self.steps += 1

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y),
                                           batch_size=self.batch_size, drop_last=True)


def test_the_batch_set_is_at_most_the_training_set_and_training_runs():
    fit = FitBatchSize()
    with memfit.simulated_device("64MiB"):
        module = Small()
        pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, max_epochs=2,
                   callbacks=[fit]).fit(module)
    assert fit.plan.max_batch > len(X)  # what fits: more than the data
    assert module.batch_size == fit.optimal_batch_size == len(X)
    assert module.steps == 2  # one full batch an epoch
