"""Lightning's fit loop validates between training steps, beside the
optimizer's state: FitBatchSize sized the batch from training_step alone
and set 548, where a validation_step of 8 test-time augmentations runs out
of memory above 136, and a val_dataloader of twice the batch above 547;
one keeping its features for on_validation_epoch_end above 286.
The batch set is the largest whose validation fits too (See Note [The
validation inside the fit loop], integrations/lightning.py), measured on a
copy of the module: the user's own lists and metrics see only the loop's
steps. The truth is Lightning's own loop on a simulated device."""

import gc

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit._native import tracked_live_bytes

pl = pytest.importorskip("lightning.pytorch")
from lightning_setup import BUDGET, DATA, Classifier, quiet_trainer  # noqa: E402
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py



class Validated(Classifier):
    """validation_step records each batch it is given in a list of its own."""

    def __init__(self, batch_size=4):
        super().__init__(batch_size)
        self.validated = []

    def validation_step(self, batch, batch_idx):
        self.validated.append(len(batch[0]))
        self.log("val_loss", F.cross_entropy(self.net(batch[0]), batch[1]))

    def val_dataloader(self):
        return torch.utils.data.DataLoader(DATA, batch_size=self.batch_size)


class TwiceTheBatch(Validated):
    def val_dataloader(self):
        return torch.utils.data.DataLoader(DATA, batch_size=2 * self.batch_size)


class Augmented(Validated):
    """Eight test-time augmentations of each validation batch at once."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.validated.append(len(x))
        xs = torch.cat([x, -x, x * 0.5, x * 2, x + 1, x - 1, x.flip(1), -x.flip(1)])
        out = self.net(xs).view(8, len(x), -1).mean(0)
        self.log("val_loss", F.cross_entropy(out, y))


class KeepsFeatures(Validated):
    """Keeps each validation batch's 1024 features for the epoch's end, as
    Lightning's docs keep outputs, and concatenates them there."""

    def validation_step(self, batch, batch_idx):
        self.validated.append(len(batch[0]))
        x = batch[0]
        self.features.append(torch.cat([self.net[:2](x), self.net[:4](x)], 1))

    def __init__(self, batch_size=4):
        super().__init__(batch_size)
        self.features = []

    def on_validation_epoch_end(self):
        self.norm = torch.cat(self.features).norm().item()
        self.features.clear()


def _fit(make, batch_size, callbacks=()):
    """Four training steps, validating after the second and the fourth (two
    batches each, and two before training), on the simulated device."""
    gc.collect()
    left = tracked_live_bytes("cpu")
    with memfit.simulated_device(BUDGET + left):
        module = make(batch_size)
        quiet_trainer(max_steps=4,
                      val_check_interval=2, limit_val_batches=2, num_sanity_val_steps=2,
                      callbacks=list(callbacks)).fit(module)
    return module


# Twice the batch lowers it by a sample or none (the training step's own
# answer depends on the threads' kernels); 8 augmentations to a quarter.
@pytest.mark.parametrize("make, per_batch, lowered", [(TwiceTheBatch, 2, False),
                                                      (Augmented, 1, True),
                                                      (KeepsFeatures, 1, True)],
                         ids=["val_dataloader of twice the batch", "8 augmentations",
                              "features kept for the epoch's end"])
def test_the_fitted_batch_runs_the_loops_validation_and_is_tight(make, per_batch, lowered):
    fit = FitBatchSize()
    module = _fit(make, 4, [fit])
    b = fit.optimal_batch_size
    assert module.batch_size == b
    # Validated at the fitted batch with no OOM: the sanity check's 2 batches
    # and 2 after each of the 2 checks, and nothing the rehearsal ran.
    assert module.validated == [per_batch * b] * 6
    if lowered:
        assert any(n.startswith("validation_step at ") for n in fit.plan.notes)
        assert b < 0.8 * fit.plan.max_batch
    module = None
    # Tight: Lightning's loop runs out of memory 3% above it.
    with pytest.raises(torch.OutOfMemoryError):
        _fit(make, b + max(2, b // 33))


def test_a_validation_lighter_than_training_keeps_the_training_batch():
    fit = FitBatchSize()
    module = _fit(Validated, 4, [fit])
    assert not any(n.startswith("validation_step at ") for n in fit.plan.notes)
    assert module.validated == [fit.optimal_batch_size] * 6


class FourAugmentations(Validated):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.validated.append(len(x))
        out = self.net(torch.cat([x, -x, x * 0.5, x * 2]))
        self.log("val_loss", F.cross_entropy(out, y.repeat(4)))


def test_a_validation_inside_keep_effective_batchs_accumulation_fits_beside_the_gradients():
    # Validating every 2 micro-batches of 1200 / b: inside the second
    # optimizer step's accumulation the loop keeps the gradients through it
    # beside Adam's state (it frees them only between optimizer steps).
    # Without them counted the batch was 240 x 5, and the validation ran
    # out of memory there.
    fit = FitBatchSize(keep_effective_batch=1200)
    gc.collect()
    left = tracked_live_bytes("cpu")
    with memfit.simulated_device(BUDGET + left):
        module = FourAugmentations(4)
        t = quiet_trainer(max_steps=2,
                          val_check_interval=2, limit_val_batches=2, num_sanity_val_steps=0,
                          callbacks=[fit])
        t.fit(module)
        b, k = fit.optimal_batch_size, t.accumulate_grad_batches
        assert b * k == 1200 and module.validated[:2] == [b, b]
        module = t = None


class TwoValidationSets(Validated):
    """A plain set, then one validated with 8 augmentations: the loop runs
    them one after the other, passing dataloader_idx."""

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        self.validated.append((dataloader_idx, len(x)))
        if dataloader_idx == 1:
            x = torch.cat([x, -x, x * 0.5, x * 2, x + 1, x - 1, x.flip(1), -x.flip(1)])
        self.log("val_loss", F.cross_entropy(self.net(x)[:len(y)], y))

    def val_dataloader(self):
        return [torch.utils.data.DataLoader(DATA, batch_size=self.batch_size)] * 2


def test_each_of_several_validation_loaders_is_checked_with_its_own_index():
    # Skipped as "no batch_size" before: 548 set, the second set ran out.
    fit = FitBatchSize()
    module = _fit(TwoValidationSets, 4, [fit])
    b = fit.optimal_batch_size
    assert 4 * b < fit.plan.max_batch
    assert module.validated == [(0, b), (0, b), (1, b), (1, b)] * 3
