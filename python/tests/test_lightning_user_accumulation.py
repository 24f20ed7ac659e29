"""Lightning's FitBatchSize when the user's pl.Trainer accumulates gradients
itself (accumulate_grad_batches=3, or a GradientAccumulationScheduler): the
micro-batches after the first keep the gradients through their backward, so
the batch set must run in Lightning's own loop with them kept."""

import gc

import pytest
import torch
import torch.nn.functional as F

import memfit

pl = pytest.importorskip("lightning.pytorch")
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

BUDGET = "12MiB"
X = torch.randn(512, 64, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 10, (512,), generator=torch.Generator().manual_seed(1))


pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 16

    def __getitem__(self, i):
        return X[i % len(X)], Y[i % len(X)]


class Wide(pl.LightningModule):
    """64-512-512-10 with Adam: gradients of 1.2 MB beside the activations."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(),
                                       torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                       torch.nn.Linear(512, 10))
        self.batch_size = 4

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters())

    def train_dataloader(self):
        return torch.utils.data.DataLoader(Samples(), batch_size=self.batch_size, shuffle=True)


class Sizes(pl.Callback):
    def __init__(self):
        self.sizes = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.sizes.append(batch[0].shape[0])


@pytest.mark.parametrize("accumulation", [
    dict(accumulate_grad_batches=3),
    dict(callbacks=[pl.callbacks.GradientAccumulationScheduler({0: 3})]),
], ids=["accumulate_grad_batches", "scheduler"])
def test_the_fitted_batch_runs_lightnings_loop_that_accumulates(accumulation):
    gc.collect()
    with memfit.simulated_device(BUDGET):
        module, fit, sizes = Wide(), FitBatchSize(), Sizes()
        callbacks = [fit, sizes, *accumulation.pop("callbacks", [])]
        trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, max_steps=2, callbacks=callbacks,
                             **accumulation)
        trainer.fit(module)  # an out-of-memory error in Lightning's own loop fails the test
        assert sizes.sizes == [fit.optimal_batch_size] * 6
