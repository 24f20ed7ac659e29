"""The Hugging Face FitBatchSize on seq2seq data padded per batch (labels
padded apart from input_ids, as DataCollatorForSeq2Seq does): every source
is as long, one target is longer than the rest. The scan of the training
samples read input_ids alone, found nothing longer than the first batch,
and kept its batch of 32, whose Trainer step ran out of memory on the long
target (the decoder and the logits grow with it). The truth is the
Trainer's own steps on a simulated device of the budget, every target that
long."""

import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

transformers.logging.set_verbosity_error()
VOCAB, N, SOURCE, TARGET, LONG = 128, 512, 16, 8, 96
BUDGET = 16 << 20
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


class Pairs(torch.utils.data.Dataset):
    """`n` sources of SOURCE tokens; targets of TARGET, the last one LONG
    (or all of `only`)."""

    def __init__(self, only=None, n=N):
        self.only, self.n = only, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        target = self.only or (LONG if i == self.n - 1 else TARGET)
        return {"input_ids": torch.randint(2, VOCAB, (SOURCE,), generator=g).tolist(),
                "labels": torch.randint(2, VOCAB, (target,), generator=g).tolist()}


def pad(samples):
    """Sources and labels each padded to their own longest (labels with
    -100), as DataCollatorForSeq2Seq."""
    n = max(len(s["input_ids"]) for s in samples)
    m = max(len(s["labels"]) for s in samples)
    ids = torch.zeros(len(samples), n, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full((len(samples), m), -100)
    for i, s in enumerate(samples):
        ids[i, :len(s["input_ids"])] = torch.tensor(s["input_ids"])
        mask[i, :len(s["input_ids"])] = 1
        labels[i, :len(s["labels"])] = torch.tensor(s["labels"])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def t5():
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0))


def arguments(tmp_path, batch, steps, **more):
    return transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        per_device_train_batch_size=batch, max_steps=steps, **more)


def test_the_batch_fitted_on_short_targets_runs_the_longest_target(tmp_path):
    with memfit.simulated_device(BUDGET):
        fit = FitBatchSize()
        args = arguments(tmp_path, 32, 1)
        transformers.Trainer(model=t5(), args=args, train_dataset=Pairs(), data_collator=pad,
                             callbacks=[fit])
    batch = args.per_device_train_batch_size
    assert any(f"a training sample's {LONG}" in note for note in fit.plan.notes), fit.plan.notes
    assert batch < 32
    fit = None
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        trainer = transformers.Trainer(model=t5(), args=arguments(tmp_path, batch, 2),
                                       train_dataset=Pairs(only=LONG), data_collator=pad)
        trainer.train()  # an out-of-memory error fails the test
        trainer = None
