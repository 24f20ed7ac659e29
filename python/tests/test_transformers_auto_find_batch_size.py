"""The Hugging Face FitBatchSize with TrainingArguments(auto_find_batch_size=
True): the callback turns it off and says so, so that the Trainer's loop
runs the batch set, resuming from a checkpoint saved at another batch too,
and the effective batch stays the user's."""

import gc

import pytest

import memfit
from memfit._native import tracked_live_bytes

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402
from test_integrations_transformers import Counting  # noqa: E402
from test_transformers_eval_outputs_kept import Tokens, gpt2  # noqa: E402

transformers.logging.set_verbosity_error()
BUDGET = 16 << 20
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


def arguments(out, steps, **kw):
    return transformers.TrainingArguments(
        output_dir=str(out), use_cpu=True, report_to=[], logging_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0, per_device_train_batch_size=64,
        max_steps=steps, auto_find_batch_size=True, **kw)


def test_resuming_a_checkpoint_saved_at_a_larger_batch_runs_the_batch_set(tmp_path):
    # Guards against what was: auto_find_batch_size took the checkpoint's batch of 64 on
    # resume, and after ten out-of-memory retries trained 19 x 4 where memfit set 16 x 4.
    transformers.Trainer(model=gpt2(), train_dataset=Tokens(4096),
                         args=arguments(tmp_path, 1, save_strategy="steps", save_steps=1)).train()
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        args = arguments(tmp_path, 3, save_strategy="no")
        fit = FitBatchSize()
        with pytest.warns(UserWarning, match=r"^\[FitBatchSize\] auto_find_batch_size turned "
                          r"off: the batch is the one set here \(\d+ x \d+\)"):
            trainer = Counting(model=gpt2(), args=args, train_dataset=Tokens(4096), callbacks=[fit])
        batch, accumulation = fit.plan.batch_size, fit.plan.accumulation
        assert batch * accumulation == 64 and accumulation > 1
        assert not args.auto_find_batch_size and "auto_find_batch_size turned off" in fit.plan.notes
        # The truth: the Trainer's own loop, resumed from the checkpoint.
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
        assert trainer.sizes == [batch] * (2 * accumulation)
        trainer = None
