"""The Hugging Face FitBatchSize sizes the evaluation batch at the longest
evaluation sample: the evaluation loader is not shuffled, so its first
batch is as long as the first samples, and a set whose later samples are
longer (padded per batch) must still evaluate at the batch set."""

import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

transformers.logging.set_verbosity_error()
VOCAB, SHORT, LONG, BUDGET = 256, 8, 64, 16 << 20
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


class Texts(torch.utils.data.Dataset):
    """n samples: the first `short` of SHORT tokens, the others LONG."""

    def __init__(self, n, short=0):
        self.n, self.short = n, short

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        n = SHORT if i < self.short else LONG
        return {"input_ids": torch.randint(2, VOCAB, (n,),
                                           generator=torch.Generator().manual_seed(i)).tolist()}


def pad(samples):
    """Padded to the batch's longest sample, labels = input_ids (-100 on padding)."""
    n = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), n, dtype=torch.long)
    mask = torch.zeros(len(samples), n, dtype=torch.long)
    for i, s in enumerate(samples):
        ids[i, :len(s["input_ids"])] = torch.tensor(s["input_ids"])
        mask[i, :len(s["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def gpt2():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=LONG,
        attn_implementation="eager", bos_token_id=0, eos_token_id=1))


def trainer(tmp_path, eval_batch, eval_samples, callbacks=()):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        per_device_train_batch_size=4, max_steps=1, per_device_eval_batch_size=eval_batch)
    return transformers.Trainer(model=gpt2(), args=args, train_dataset=Texts(256),
                                eval_dataset=eval_samples, data_collator=pad,
                                callbacks=list(callbacks))


def test_the_eval_batch_fitted_on_short_first_samples_evaluates_the_longest(tmp_path):
    # Guards against what was: sized on the first eval batch, 8 tokens long, the eval batch
    # was the 128 asked for, and the Trainer's evaluation ran out of memory at 64 tokens.
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        fit = FitBatchSize()
        trainer(tmp_path, 128, Texts(256, short=128), [fit])
    eval_batch = fit.plan.eval_batch_size
    assert 0 < eval_batch < 128
    assert any(n.startswith(f"evaluation: the first batch is {SHORT} long along dimension 1 "
                            f"and an evaluation sample {LONG}: the batch is fitted at {LONG}")
               for n in fit.plan.notes), fit.plan.notes
    fit = None
    gc.collect()
    # The truth: the Trainer's own loop, a step then its evaluation, every sample LONG.
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        run = trainer(tmp_path, eval_batch, Texts(2 * eval_batch))
        run.train()
        assert run.evaluate()["eval_loss"] > 0  # an OOM would raise
        run = None


def test_named_eval_sets_are_each_fitted_and_evaluate_at_the_batch_set(tmp_path):
    # Guards against what was: eval_dataset={"short": ..., "long": ...} raised KeyError: 0
    # when the Trainer was built (the loader of the dict itself was read).
    sets = {"short": Texts(256, short=256), "long": Texts(256)}
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        fit = FitBatchSize()
        trainer(tmp_path, 128, sets, [fit])
    eval_batch = fit.plan.eval_batch_size
    assert 0 < eval_batch < 128  # the long set's: the short one's is the 128 asked
    fit = None
    gc.collect()
    # The truth: the Trainer's own loop, a step then the evaluation of each set.
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        run = trainer(tmp_path, eval_batch, {"short": Texts(2 * eval_batch, short=256),
                                             "long": Texts(2 * eval_batch)})
        run.train()
        metrics = run.evaluate()  # an OOM would raise
        assert metrics["eval_short_loss"] > 0 and metrics["eval_long_loss"] > 0
        run = None
