"""The Hugging Face FitBatchSize sizes the evaluation batch with the outputs
HF's evaluation loop keeps on the device: with compute_metrics and
eval_accumulation_steps=k, each batch's logits and labels stay,
concatenated, until k batches are moved to the host. The batch set runs
the Trainer's own evaluation during training at the budget."""

import gc

import numpy as np
import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

transformers.logging.set_verbosity_error()
VOCAB, LENGTH, BUDGET, WINDOW = 256, 32, 8 << 20, 4
pool = torch.randint(2, VOCAB, (64, LENGTH), generator=torch.Generator().manual_seed(0))
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"input_ids": pool[i % 64], "labels": pool[i % 64]}


def gpt2():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=LENGTH,
        attn_implementation="eager", bos_token_id=0, eos_token_id=1))


def accuracy(prediction):
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}


def trainer(tmp_path, eval_batch, eval_samples, callbacks=(), window=WINDOW):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        per_device_train_batch_size=8, gradient_accumulation_steps=2, max_steps=1,
        eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=eval_batch,
        eval_accumulation_steps=window)
    return transformers.Trainer(model=gpt2(), args=args, train_dataset=Tokens(1024),
                                eval_dataset=Tokens(eval_samples), compute_metrics=accuracy,
                                callbacks=list(callbacks))


def test_the_eval_batch_holds_the_outputs_kept_until_moved_to_the_host(tmp_path):
    # Guards against what was: sized from the loss alone, the eval batch was 30, and the
    # Trainer's evaluation ran out of memory at 22 (21 runs).
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        fit = FitBatchSize()
        trainer(tmp_path, 4096, 1024, [fit])
    batch, accumulation = fit.plan.batch_size, fit.plan.accumulation
    eval_batch = fit.plan.eval_batch_size
    assert (batch, accumulation) == (8, 2) and 0 < eval_batch < 4096
    gc.collect()
    # The truth: the Trainer's own loop, evaluating during training at that batch. The
    # evaluation set is one window: on the simulated (CPU) device the first window's
    # arrays, moved "to the host", stay counted, where a card frees them.
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        run = trainer(tmp_path, eval_batch, WINDOW * eval_batch)
        run.train()  # an OOM would raise
        assert 0 <= run.state.log_history[0]["eval_accuracy"] <= 1
        run = None


def test_every_output_kept_past_the_budget_is_said_and_runs_out(tmp_path):
    # Without eval_accumulation_steps no eval batch helps: 512 samples' logits (16 MiB)
    # outgrow an 8 MiB device. Said, where before the batch was set in silence.
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        fit = FitBatchSize()
        with pytest.warns(UserWarning, match=r"^\[FitBatchSize\] compute_metrics keeps every "
                          r"evaluation batch's logits and labels on the device, 32.\d+ MiB for 512 "
                          r"samples with their last concatenation, more than the .* the "
                          r"evaluation has: set eval_accumulation_steps"):
            run = trainer(tmp_path, 4096, 512, [fit], window=None)
        with pytest.raises(torch.OutOfMemoryError):  # the truth: the Trainer's evaluation
            run.evaluate()
        run = None
