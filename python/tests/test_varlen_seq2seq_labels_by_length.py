"""The Hugging Face FitBatchSize with lengths= on seq2seq data: sources of
16 tokens, targets padded apart from them (DataCollatorForSeq2Seq), one
target longer than the rest. The fit per length resized input_ids alone
and kept the first batch's short targets: it said 78 at 16 tokens, and
the Trainer's own steps at 78 ran out of memory at the batch holding that
target (in one epoch of its own sampler too). The truth is the Trainer's
own steps on a simulated device of the budget, every target that long."""

import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

transformers.logging.set_verbosity_error()
VOCAB, N, SOURCE, TARGET, LONG_TARGET = 128, 64, 16, 8, 96
BUDGET = 16 << 20
SEQ_DIM = {"input_ids": 1, "attention_mask": 1}
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


class Pairs(torch.utils.data.Dataset):
    """Sources of SOURCE tokens; targets of TARGET, the last one
    LONG_TARGET (or every one `target`)."""

    def __init__(self, target=None):
        self.target = target

    def __len__(self):
        return N

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        target = self.target or (LONG_TARGET if i == N - 1 else TARGET)
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


def arguments(tmp_path, batch, steps):
    # In order: the first batch, the one measured, holds short targets.
    return transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        per_device_train_batch_size=batch, max_steps=steps, train_sampling_strategy="sequential")


def test_each_length_is_fitted_with_the_longest_target(tmp_path):
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        fit = FitBatchSize(seq_dim=SEQ_DIM, lengths=[SOURCE])
        transformers.Trainer(model=t5(), args=arguments(tmp_path, 8, 1), train_dataset=Pairs(),
                             data_collator=pad, callbacks=[fit])
    batch = fit.length_fit.at(SOURCE)
    assert any(f"a training sample's {LONG_TARGET}" in note for note in fit.plan.notes)
    fit = None
    # The truth: the Trainer's own steps at the batch said to fit, every
    # target LONG_TARGET.
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        trainer = transformers.Trainer(
            model=t5(), args=arguments(tmp_path, batch, 2), data_collator=pad,
            train_dataset=Pairs(target=LONG_TARGET))
        trainer.train()  # an out-of-memory error fails the test
        trainer = None
