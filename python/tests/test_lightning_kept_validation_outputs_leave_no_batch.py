"""Outputs a callback keeps over a whole validation (on_validation_batch_end)
that leave no validation batch fitting: Lightning's loop runs out of memory
even at a batch of 1. FitBatchSize said "[fit] the budget is 0 B: no step
fits in it"; it now says in one line who keeps what per sample, how many
would fit without it, and what to keep instead, as on the training side
(test_lightning_kept_outputs_leave_no_batch.py). The truth is Lightning's
own loop on a simulated device of the budget."""

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
import lightning_setup as setup  # noqa: E402
from memfit._native import native  # noqa: E402
from memfit.integrations.lightning import FitBatchSize  # noqa: E402
from test_lightning_callback_keeps_outputs import (KeepsValidationOutputs,  # noqa: E402
                                                   ValidatesFeatures)

pytestmark = pytest.mark.usefixtures("quiet_lightning")  # see conftest.py

# Two training steps, then one validation over all 4096 samples of DATA: the
# kept 512-wide features (2 KiB a sample) make 8 MiB, the whole budget.
FLAGS = dict(max_epochs=1, limit_train_batches=2, num_sanity_val_steps=0)


def test_kept_validation_outputs_leaving_no_batch_say_who_keeps_what_in_one_line():
    with pytest.raises(torch.OutOfMemoryError):  # Lightning's loop: not even at 1
        setup.fit_on_device(ValidatesFeatures, 1, [KeepsValidationOutputs()], **FLAGS)
    with pytest.raises(native.DoesNotFit) as error:
        setup.fit_on_device(ValidatesFeatures, 4, [FitBatchSize(), KeepsValidationOutputs()],
                            **FLAGS)
    said = str(error.value)
    assert "\n" not in said
    # Who ran (what they keep is measured together): the step whose outputs the hook keeps.
    assert said.startswith("[FitBatchSize] no validation batch fits beside what validation_step "
                           "and KeepsValidationOutputs.on_validation_batch_end keep over the "
                           "validation: 2.00 KiB a sample, 8.00 MiB over its 4096 samples ("), said
    assert said.endswith("keep numbers (.item()) or host copies (.detach().cpu()), not the "
                         "tensors on the device")
