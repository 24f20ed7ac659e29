"""A training_step that returns None at some batches: Lightning's loop skips
the backward and the optimizer step there and trains on the others. Called
at batch_idx 0 only, FitBatchSize's rehearsal got None and raised where
Lightning's loop trains (See Note [A training_step that skips batches],
integrations/lightning.py). The truth is Lightning's own loop on a
simulated device of the budget."""

import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

pl = pytest.importorskip("lightning.pytorch")
import lightning_setup as setup  # noqa: E402
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py


class SkipsTheFirst(setup.Classifier):
    """Skips batch_idx 0 (a warm-up batch)."""

    def training_step(self, batch, batch_idx):
        return None if batch_idx == 0 else super().training_step(batch, batch_idx)


class SkipsAll(setup.Classifier):
    def training_step(self, batch, batch_idx):
        return None


def train(kind, batch_size=4, callbacks=()):
    """Lightning's loop on the device, the module made there."""
    gc.collect()
    with memfit.simulated_device(setup.BUDGET + tracked_live_bytes("cpu")):
        module = kind(batch_size)
        setup.quiet_trainer(max_steps=3, callbacks=list(callbacks)).fit(module)
    return module.batch_size


def test_a_step_that_skips_its_first_batch_is_sized_at_one_that_trains():
    fit = FitBatchSize()
    batch = train(SkipsTheFirst, 4, [fit])  # an OOM in Lightning's loop would raise
    assert batch == fit.optimal_batch_size > 4
    fit = None
    train(SkipsTheFirst, batch)  # Lightning's loop alone, at the batch set
    with pytest.raises(torch.OutOfMemoryError):  # tight: 2% above it runs out
        train(SkipsTheFirst, batch + batch // 50)


def test_a_step_that_never_gives_a_loss_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^\[FitBatchSize\] training_step returned None at "
                                         r"batch_idx 0 to 15"):
        train(SkipsAll, 4, [FitBatchSize()])
