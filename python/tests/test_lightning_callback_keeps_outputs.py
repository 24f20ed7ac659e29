"""A user's callback whose on_train_batch_end keeps the step's outputs (or a
tensor the module holds) in a list for its on_train_epoch_end: they pile up
over the epoch beside every later step, as the module's own do. FitBatchSize,
not running the callback's hook, said 419 where Lightning's loop ran out of
memory and runs 59 at most (See Note [What the callbacks keep at each batch's
end], integrations/lightning_rehearsal.py). The truth is Lightning's own loop
on a simulated device of the budget."""

import threading

import pytest
import torch
import torch.nn.functional as F

pl = pytest.importorskip("lightning.pytorch")
import lightning_setup as setup  # noqa: E402
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py


class ReturnsFeatures(setup.Classifier):
    """Returns its 512-wide features beside the loss, and holds the last."""

    def training_step(self, batch, batch_idx):
        h = self.net[:4](batch[0])
        self.last_h = h.detach()
        return {"loss": F.cross_entropy(self.net[4](h), batch[1]), "h": h}


class KeepsOutputs(pl.Callback):
    """Keeps outputs["h"] of each batch until the epoch ends; `seen`: the
    batches the hook ran at (kept)."""

    def __init__(self):
        self.kept, self.seen = [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.kept.append(outputs["h"])
        self.seen.append(batch_idx)

    def on_train_epoch_end(self, trainer, pl_module):
        self.kept.clear()


class KeepsTheModulesTensor(KeepsOutputs):
    """Keeps what the module holds (replaced each step) instead."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.kept.append(pl_module.last_h)
        self.seen.append(batch_idx)


def train(batch_size, callbacks):
    """Lightning's loop over one epoch of 12 batches."""
    return setup.fit_on_device(ReturnsFeatures, batch_size, callbacks, max_epochs=1,
                               limit_train_batches=12)


@pytest.mark.parametrize("kind", [KeepsOutputs, KeepsTheModulesTensor],
                         ids=["outputs", "module_tensor"])
def test_what_a_callback_keeps_over_the_epoch_is_held_beside_each_step(kind):
    fit, keeps = FitBatchSize(), kind()
    batch = train(4, [fit, keeps])  # an OOM in Lightning's loop would raise
    assert batch == fit.optimal_batch_size > 4
    assert f"{kind.__name__}.on_train_batch_end keeps 2.00 KiB a sample" in fit.plan.notes[0]
    assert keeps.seen == list(range(12))  # the rehearsal ran copies: the user's saw the loop's
    fit = None
    with pytest.raises(torch.OutOfMemoryError):  # tight: 5% above it runs out
        train(batch + max(2, batch // 20), [kind()])


class KeepsBehindALock(KeepsOutputs):
    """A callback that cannot be copied: its hook is not rehearsed."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()


def test_a_callback_not_rehearsed_is_named_and_the_batch_unverified():
    fit = FitBatchSize()
    with pytest.warns(UserWarning, match="KeepsBehindALock.on_train_batch_end was not "
                      "rehearsed .it cannot be copied.: .* unverified"):
        with pytest.raises(torch.OutOfMemoryError):  # what it keeps is not counted
            train(4, [fit, KeepsBehindALock()])
    assert any(n.startswith("KeepsBehindALock.on_train_batch_end was not rehearsed")
               for n in fit.plan.notes)


class ValidatesFeatures(setup.Classifier):
    """validation_step returns its 512-wide features, over DATA."""

    def validation_step(self, batch, batch_idx):
        return {"h": self.net[:4](batch[0])}

    def val_dataloader(self):
        return torch.utils.data.DataLoader(setup.DATA, batch_size=self.batch_size)


class KeepsValidationOutputs(pl.Callback):
    """Keeps outputs["h"] of each validation batch until the validation ends:
    FitBatchSize said 557, where Lightning's loop ran out of memory and runs
    177 at most."""

    def __init__(self):
        self.kept, self.seen = [], []

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx,
                                dataloader_idx=0):
        self.kept.append(outputs["h"])
        self.seen.append(batch_idx)

    def on_validation_epoch_end(self, trainer, pl_module):
        self.kept.clear()


def test_what_a_callback_keeps_over_a_validation_is_held_beside_it():
    flags = dict(max_steps=4, val_check_interval=2, limit_val_batches=12,
                 num_sanity_val_steps=0)
    fit, keeps = FitBatchSize(), KeepsValidationOutputs()
    batch = setup.fit_on_device(ValidatesFeatures, 4, [fit, keeps], **flags)
    assert batch == fit.optimal_batch_size > 4
    assert keeps.seen == list(range(12)) * 2  # the loop's two validations, no more
    fit = None
    with pytest.raises(torch.OutOfMemoryError):  # tight: 5% above it runs out
        setup.fit_on_device(ValidatesFeatures, batch + max(2, batch // 20),
                            [KeepsValidationOutputs()], **flags)
