"""trainer.fit(ckpt_path=...) holds the loaded checkpoint, weights and
Adam's state, on the device from before on_fit_start until it has
restored them, before the first step. FitBatchSize took it for memory held
beside every step and raised "even a batch of 1 ran out of memory" where
Lightning's loop resumes at 557 (See Note [A checkpoint being resumed],
integrations/lightning.py). The truth is Lightning's own loop, resumed on
the simulated device."""

import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

pl = pytest.importorskip("lightning.pytorch")
import lightning_setup as setup  # noqa: E402
from memfit.integrations.lightning import FitBatchSize  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint after 2 steps at a batch of 4, saved from the host."""
    trainer = setup.quiet_trainer(max_steps=2)
    trainer.fit(setup.Classifier(4))
    path = tmp_path_factory.mktemp("resume") / "two_steps.ckpt"
    trainer.save_checkpoint(path)
    return path


def _resume(path, batch_size, callbacks=()):
    """Lightning's loop resumed from `path` for 3 more steps on the device."""
    gc.collect()
    with memfit.simulated_device(setup.BUDGET + tracked_live_bytes("cpu")):
        module = setup.Classifier(batch_size)
        trainer = setup.quiet_trainer(max_steps=5, callbacks=list(callbacks))
        trainer.fit(module, ckpt_path=path)
    return trainer, module


def test_the_batch_fitted_when_resuming_runs_lightnings_loop_and_is_tight(checkpoint):
    fit = FitBatchSize()
    trainer, module = _resume(checkpoint, 4, [fit])
    b = fit.optimal_batch_size
    assert b == module.batch_size and b > 100, b
    # The checkpoint was restored: Adam goes on from its 2 steps.
    state = trainer.optimizers[0].state_dict()["state"]
    assert trainer.global_step == 5 and all(int(s["step"]) == 5 for s in state.values())
    trainer = module = state = None
    with pytest.raises(torch.OutOfMemoryError):  # Lightning's loop 3% above it
        _resume(checkpoint, b + max(2, b // 33))
