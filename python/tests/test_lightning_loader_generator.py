"""Lightning's FitBatchSize peeks at the first training batch: with a
DataLoader drawing its order from a generator the module keeps
(shuffle=True, generator=self.g), the peek drew from that generator and
training saw another order than without memfit. The generator is put back:
the first samples trained on are the same with the callback as without."""

import pytest
import torch
import torch.nn.functional as F

import memfit

pl = pytest.importorskip("lightning.pytorch")
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py

X = torch.arange(4096, dtype=torch.float32)[:, None].repeat(1, 16)


class Indexed(torch.utils.data.Dataset):
    def __len__(self):
        return len(X)

    def __getitem__(self, i):
        return X[i], 0


class Shuffled(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(16, 2)
        self.batch_size = 8
        self.g = torch.Generator().manual_seed(0)
        self.first = None

    def on_train_batch_start(self, batch, batch_idx):  # Lightning's loop only
        if self.first is None:
            self.first = batch[0][:3, 0].tolist()  # the permutation's first samples

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.lin(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(Indexed(), batch_size=self.batch_size, shuffle=True,
                                           generator=self.g)


def _first_samples(callbacks):
    module = Shuffled()
    pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, max_steps=1,
               callbacks=callbacks).fit(module)
    return module.first


def test_the_callback_leaves_the_loaders_own_generator_where_it_was():
    plain = _first_samples([])
    with memfit.simulated_device("64MiB"):
        fitted = _first_samples([FitBatchSize()])
    assert fitted == plain
