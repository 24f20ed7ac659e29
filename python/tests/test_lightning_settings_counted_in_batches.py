"""Settings Lightning checks against the batches an epoch has, right at the
user's batch of 4 (1024 batches) and wrong at the 557 FitBatchSize sets (8):
val_check_interval=100 batches, limit_val_batches=0.1 of them. Lightning's
loop raised after the callback, saying nothing of the batch; FitBatchSize
now refuses in one line naming the setting (See Note [Settings counted in
batches], integrations/lightning.py). The truth is Lightning's own loop at
557."""

import pytest
import torch
import torch.nn.functional as F

pl = pytest.importorskip("lightning.pytorch")
import lightning_setup as setup  # noqa: E402
from lightning.pytorch.utilities.exceptions import MisconfigurationException  # noqa: E402
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py

SETTINGS = {
    "val_check_interval": (dict(val_check_interval=100, limit_val_batches=2),
                           "[FitBatchSize] at the batch of 557 an epoch has 8 training batches, "
                           "and val_check_interval=100 is past its end (Lightning raises): pass "
                           "check_val_every_n_epoch=None to count it across epochs, or give it "
                           "as a fraction of the epoch; 557 fits"),
    "limit_val_batches": (dict(limit_val_batches=0.1),
                          "[FitBatchSize] at the batch of 557 the val loader has 8 batches, and "
                          "limit_val_batches=0.1 of them is none (Lightning raises): give it as "
                          "a number of batches, or a fraction of at least 0.125; 557 fits"),
}


class Validated(setup.Classifier):
    """Validates on DATA at its batch_size."""

    def validation_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def val_dataloader(self):
        return torch.utils.data.DataLoader(setup.DATA, batch_size=self.batch_size)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_lightnings_loop_refuses_the_setting_at_557_and_takes_it_at_4(setting):
    flags = SETTINGS[setting][0]
    setup.quiet_trainer(max_steps=1, num_sanity_val_steps=0, **flags).fit(Validated(4))
    with pytest.raises((ValueError, MisconfigurationException), match=setting):
        setup.quiet_trainer(max_steps=1, **flags).fit(Validated(557))


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_a_setting_wrong_at_the_batch_set_is_refused_in_one_line(setting):
    flags, said = SETTINGS[setting]
    module = []

    def made(batch_size):
        module.append(Validated(batch_size))
        return module[0]

    with pytest.raises(ValueError) as error:
        setup.fit_on_device(made, 4, [FitBatchSize()], max_steps=1, **flags)
    assert str(error.value) == said
    assert module[0].batch_size == 4  # as it was
