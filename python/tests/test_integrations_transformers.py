"""memfit.integrations.transformers with the real Hugging Face Trainer: on the
simulated device FitBatchSize sets per_device_train_batch_size and
gradient_accumulation_steps before training so their product stays the
user's effective batch, the Trainer's own loop then runs 20 steps with no
OOM, and the eval batch is sized apart."""

import gc
import os
import subprocess
import sys

import pytest
import torch

import memfit

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

transformers.logging.set_verbosity_error()
SEQ, VOCAB = 16, 128
POOL = torch.randint(0, VOCAB, (64, SEQ), generator=torch.Generator().manual_seed(0))
BUDGET = "2MiB"


class Tokens(torch.utils.data.Dataset):
    """Causal-LM samples (labels = input_ids), over and over."""

    def __init__(self, n=1 << 14):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = POOL[i % len(POOL)]
        return {"input_ids": ids, "labels": ids}


def gpt2():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
        attn_implementation="eager", bos_token_id=0, eos_token_id=1))


def arguments(tmp_path, **kw):
    return transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0, **kw)


class Counting(transformers.Trainer):
    """The HF Trainer, noting the batch of each micro-batch its loop runs."""

    def training_step(self, model, inputs, *args, **kwargs):
        self.sizes = getattr(self, "sizes", []) + [inputs["input_ids"].shape[0]]
        return super().training_step(model, inputs, *args, **kwargs)


pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


@pytest.mark.slow
def test_the_effective_batch_stays_exact_and_the_trainer_runs_20_steps(tmp_path):
    gc.collect()
    with memfit.simulated_device(BUDGET):
        args = arguments(tmp_path, per_device_train_batch_size=32, gradient_accumulation_steps=2,
                         max_steps=20, per_device_eval_batch_size=4096)
        fit = FitBatchSize()
        trainer = Counting(model=gpt2(), args=args, train_dataset=Tokens(),
                           eval_dataset=Tokens(256), callbacks=[fit])
        b, k = args.per_device_train_batch_size, args.gradient_accumulation_steps
        assert b * k == 64 and k > 2  # 32 did not fit: more accumulation, same product
        assert fit.plan.batch_size == b and fit.plan.full_size_steps <= 2
        trainer.train()  # the Trainer's own loop: an OOM would raise
        assert trainer.state.global_step == 20 and trainer.sizes == [b] * (20 * k)
        # The eval batch, sized apart, below the 4096 asked for; evaluation runs.
        assert 0 < args.per_device_eval_batch_size < 4096
        assert fit.plan.eval_batch_size == args.per_device_eval_batch_size
        assert trainer.evaluate()["eval_loss"] > 0
        trainer = None


def test_an_effective_batch_that_fits_whole_runs_without_accumulation(tmp_path):
    args = arguments(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=3,
                     max_steps=1)
    # Said where the user sees it, not only in logging.info.
    with pytest.warns(UserWarning, match=r"^\[FitBatchSize\] batch 4 x 3 -> 12 x 1: the "
                      r"largest batch that fits is \d+ under the budget of "):
        transformers.Trainer(model=gpt2(), args=args, train_dataset=Tokens(),
                             callbacks=[FitBatchSize(budget="64MiB")])
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (12, 1)


def test_added_after_the_trainer_was_built_it_says_how_to_pass_it(tmp_path):
    args = arguments(tmp_path, per_device_train_batch_size=4, max_steps=1)
    trainer = transformers.Trainer(model=gpt2(), args=args, train_dataset=Tokens())
    trainer.add_callback(FitBatchSize(budget="64MiB"))
    with pytest.raises(ValueError) as e:
        trainer.train()
    msg = str(e.value)
    assert msg.startswith("[FitBatchSize] it was added after the Trainer was built")
    assert "callbacks=[FitBatchSize(...)]" in msg and "\n" not in msg


def test_the_integration_without_transformers_says_pip_install_transformers():
    code = ("import sys; sys.modules['transformers'] = None\n"
            "try:\n    import memfit.integrations.transformers\n"
            "except ImportError as e:\n    print(repr(str(e)))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)
    assert out.stdout.strip() == ("'[memfit.integrations.transformers] transformers is not "
                                  "installed: pip install transformers'")


def test_the_callbacks_own_reserve_is_named_when_it_leaves_nothing(tmp_path, monkeypatch):
    # Guards against what was: the reserve for the loop's batches was reported as "the
    # margin 2.00 KiB leaves nothing of the budget", a margin the user never gave.
    import memfit.integrations.sizing as sizing

    monkeypatch.setattr(sizing, "_available", lambda *args, **kwargs: 1000)
    args = arguments(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=3,
                     max_steps=1)
    with pytest.raises(ValueError, match=r"^\[FitBatchSize\] the batches the loop holds beside "
                       r"the step \(3.00 KiB for 12 samples\) leave nothing of the 1000 B the "
                       r"budget leaves beside the model: give a larger budget or a smaller "
                       r"effective batch"):
        transformers.Trainer(model=gpt2(), args=args, train_dataset=Tokens(),
                             callbacks=[FitBatchSize(budget="64MiB")])


@pytest.mark.parametrize("kwargs, message", [
    (dict(budget="abc"), r"^\[FitBatchSize\] cannot read 'abc' as a size"),
    (dict(target_device="tpu"), r"^\[FitBatchSize\] target_device must be 'cpu' or 'cuda'"),
])
def test_bad_options_are_refused_when_the_callback_is_made(kwargs, message):
    # Not once the Trainer was built up to the callback.
    with pytest.raises(ValueError, match=message):
        FitBatchSize(**kwargs)
