"""The Hugging Face FitBatchSize with TrainingArguments(auto_find_batch_size=
True): the callback turns it off and says so, so that the Trainer's loop
runs the batch set, resuming from a checkpoint saved at another batch too,
and the effective batch stays the user's."""

import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

transformers.logging.set_verbosity_error()
VOCAB, LENGTH, BUDGET = 256, 32, 16 << 20
pool = torch.randint(2, VOCAB, (64, LENGTH), generator=torch.Generator().manual_seed(0))
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        return {"input_ids": pool[i % 64], "labels": pool[i % 64]}


def gpt2():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=LENGTH,
        attn_implementation="eager", bos_token_id=0, eos_token_id=1))


class Counting(transformers.Trainer):
    """The HF Trainer, noting the batch of each micro-batch its loop runs."""

    def training_step(self, model, inputs, *args, **kwargs):
        self.sizes = getattr(self, "sizes", []) + [inputs["input_ids"].shape[0]]
        return super().training_step(model, inputs, *args, **kwargs)


def arguments(out, steps, **kw):
    return transformers.TrainingArguments(
        output_dir=str(out), use_cpu=True, report_to=[], logging_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0, per_device_train_batch_size=64,
        max_steps=steps, auto_find_batch_size=True, **kw)


def test_resuming_a_checkpoint_saved_at_a_larger_batch_runs_the_batch_set(tmp_path):
    # Guards against what was: auto_find_batch_size took the checkpoint's batch of 64 on
    # resume, and after ten out-of-memory retries trained 19 x 4 where memfit set 16 x 4.
    transformers.Trainer(model=gpt2(), train_dataset=Tokens(),
                         args=arguments(tmp_path, 1, save_strategy="steps", save_steps=1)).train()
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        args = arguments(tmp_path, 3, save_strategy="no")
        fit = FitBatchSize()
        with pytest.warns(UserWarning, match=r"^\[FitBatchSize\] auto_find_batch_size turned "
                          r"off: the batch is the one set here \(\d+ x \d+\)"):
            trainer = Counting(model=gpt2(), args=args, train_dataset=Tokens(), callbacks=[fit])
        batch, accumulation = fit.plan.batch_size, fit.plan.accumulation
        assert batch * accumulation == 64 and accumulation > 1
        assert not args.auto_find_batch_size and "auto_find_batch_size turned off" in fit.plan.notes
        # The truth: the Trainer's own loop, resumed from the checkpoint.
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
        assert trainer.sizes == [batch] * (2 * accumulation)
        trainer = None
