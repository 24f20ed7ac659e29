"""A train_dataloader that builds its dataset on the device: the fit loop
builds it after on_fit_start and holds it beside every step. FitBatchSize
built it in host memory, and said 556 where Lightning's loop beside the
1 MiB dataset runs 388 at most, and as much for a val_dataloader's (See
Note [A dataset the loader holds on the device], integrations/lightning.py).
The truth is Lightning's own loop on a simulated device, where the tensors
the loaders' functions make count."""

import pytest
import torch
import torch.nn.functional as F

pl = pytest.importorskip("lightning.pytorch")
from lightning_setup import Classifier, fit_on_device  # noqa: E402
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py

SAMPLES = 4096  # 64 floats and a label each: 1.03 MiB


class BuildsItsData(Classifier):
    """train_dataloader makes its dataset."""

    def train_dataloader(self):
        x, y = torch.randn(SAMPLES, 64), torch.randint(0, 10, (SAMPLES,))
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                           batch_size=self.batch_size)


X, Y = torch.randn(SAMPLES, 64), torch.randint(0, 10, (SAMPLES,))  # made before the device


class BuildsItsValidationData(BuildsItsData):
    """Trains on data made before the device; val_dataloader makes its own,
    which the loop holds from its first validation on."""

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.cross_entropy(self.net(batch[0]), batch[1]))

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y),
                                           batch_size=self.batch_size)

    def val_dataloader(self):
        return super().train_dataloader()


def _fit(make, batch_size, callbacks=()):
    """Four steps, validating 2 batches after the second and the fourth."""
    return fit_on_device(make, batch_size, callbacks, max_steps=4, val_check_interval=2,
                         limit_val_batches=2, num_sanity_val_steps=0)


# Each said 556, where Lightning's loop runs 388 at most.
@pytest.mark.parametrize("make", [BuildsItsData, BuildsItsValidationData],
                         ids=["train_dataloader", "val_dataloader"])
def test_the_batch_set_runs_beside_the_dataset_the_loader_builds_and_is_tight(make):
    fit = FitBatchSize()
    b = _fit(make, 4, [fit])  # Lightning's loop at the batch set: an OOM would raise
    assert b == fit.optimal_batch_size > 4
    fit = None
    # Tight: Lightning's loop runs out of memory 3% above it.
    with pytest.raises(torch.OutOfMemoryError):
        _fit(make, b + max(2, b // 33))
