"""Outputs kept over the epoch (by training_step, or by a callback's
on_train_batch_end) that leave no batch fitting: Lightning's loop runs out of
memory even at a batch of 1, and FitBatchSize said only "even a batch of 1
ran out of memory ... Use a smaller batch". It now says in one line who keeps
what per sample, and what to keep instead (See Note [What training_step keeps
over an epoch], integrations/lightning_rehearsal.py). The truth is Lightning's
own loop on a simulated device of the budget."""

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
import lightning_setup as setup  # noqa: E402
from memfit._native import native  # noqa: E402
from memfit.integrations.lightning import FitBatchSize  # noqa: E402
from test_lightning_callback_keeps_outputs import KeepsOutputs, ReturnsFeatures  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py


class ReturnsMaps(ReturnsFeatures):
    """Returns a 64x64 map per sample (the first features against the
    input: 16 KiB) as "h", and keeps each in training_step too when `keeps`."""

    keeps = False

    def __init__(self, batch_size=4):
        super().__init__(batch_size)
        self.maps = []

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        out["h"] = out["h"][:, :64, None] * batch[0][:, None, :]
        if self.keeps:
            self.maps.append(out["h"].detach())
        return out


class KeepsMaps(ReturnsMaps):
    keeps = True


def train(make, batch_size, callbacks):
    """Lightning's loop over one epoch of the 4096 samples."""
    return setup.fit_on_device(make, batch_size, callbacks, max_epochs=1)


@pytest.mark.parametrize("make,keeper,who", [
    (KeepsMaps, lambda: [], "training_step keeps"),
    (ReturnsMaps, lambda: [KeepsOutputs()], "KeepsOutputs.on_train_batch_end keeps"),
], ids=["training_step", "callback"])
def test_kept_outputs_leaving_no_batch_say_who_keeps_what_in_one_line(make, keeper, who):
    with pytest.raises(torch.OutOfMemoryError):  # Lightning's loop: not even at 1
        train(make, 1, keeper())
    with pytest.raises(native.DoesNotFit) as error:
        train(make, 4, [FitBatchSize(), *keeper()])
    said = str(error.value)
    assert "\n" not in said
    assert said.startswith(f"[FitBatchSize] no batch fits beside what {who} over the epoch: "
                           f"16.00 KiB a sample after each step, 64.00 MiB over the epoch's "
                           f"4096 samples even at a batch of 1 (")
    assert said.endswith("keep numbers (.item()) or host copies (.detach().cpu()), not the "
                         "tensors on the device")
