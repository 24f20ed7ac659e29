"""FitBatchSize measures Lightning's automatic optimization. A GAN's
module optimizes manually with two optimizers: the callback said "the
module has 2 optimizers ... configure_optimizers returning a single
optimizer", which a GAN cannot do; it says, when the fit sets up, that
manual optimization is what it does not measure, and what to use."""

import pytest
import torch
import torch.nn.functional as F

pl = pytest.importorskip("lightning.pytorch")
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py


class GAN(pl.LightningModule):
    def __init__(self, batch_size=4):
        super().__init__()
        self.automatic_optimization = False
        self.batch_size = batch_size
        self.generator = torch.nn.Linear(8, 16)
        self.discriminator = torch.nn.Linear(16, 1)

    def training_step(self, batch, batch_idx):
        g_opt, d_opt = self.optimizers()
        z = torch.randn(len(batch[0]), 8)
        self.toggle_optimizer(g_opt)
        g_loss = F.softplus(-self.discriminator(self.generator(z))).mean()
        g_opt.zero_grad()
        self.manual_backward(g_loss)
        g_opt.step()
        self.untoggle_optimizer(g_opt)
        self.toggle_optimizer(d_opt)
        d_loss = (F.softplus(-self.discriminator(batch[0])).mean()
                  + F.softplus(self.discriminator(self.generator(z).detach())).mean())
        d_opt.zero_grad()
        self.manual_backward(d_loss)
        d_opt.step()
        self.untoggle_optimizer(d_opt)

    def configure_optimizers(self):
        return (torch.optim.Adam(self.generator.parameters()),
                torch.optim.Adam(self.discriminator.parameters()))

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.randn(64, 16))
        return torch.utils.data.DataLoader(data, batch_size=self.batch_size)


@pytest.mark.parametrize("fit", [dict(), dict(keep_effective_batch=64)],
                         ids=["batch", "keep_effective_batch"])
def test_a_gans_manual_optimization_is_refused_saying_why(fit):
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, max_steps=1,
                         callbacks=[FitBatchSize(budget="8MiB", **fit)])
    with pytest.raises(ValueError) as e:
        trainer.fit(GAN())
    msg = str(e.value)
    assert msg.startswith("[FitBatchSize] the module uses manual optimization "
                          "(automatic_optimization=False)")
    assert "\n" not in msg
