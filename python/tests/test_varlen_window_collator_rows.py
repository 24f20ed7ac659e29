"""The Hugging Face FitBatchSize with a data collator that cuts each sample
into windows of W tokens (a sliding-window tokenizer collator): a sample of
4 W tokens gives 4 rows of W. The first batch (short samples, a row each)
is W long; the scan of the training samples found one 4 W long and resized
the example to it: the GPT-2 of W positions raised IndexError inside
memfit, where the Trainer trains. Now the longest sample is collated alone,
its rows are the rows a sample gives, and the batch set runs the Trainer's
own steps, every sample that long. The truth is the Trainer's own steps on
a simulated device of the budget."""

import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

transformers.logging.set_verbosity_error()
VOCAB, N, W, WINDOWS = 128, 64, 32, 4
BUDGET = 24 << 20
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


class Texts(torch.utils.data.Dataset):
    """Samples of W tokens, the last one WINDOWS x W (or every one `only`)."""

    def __init__(self, only=None):
        self.only = only

    def __len__(self):
        return N

    def __getitem__(self, i):
        n = self.only or (WINDOWS * W if i == N - 1 else W)
        ids = torch.randint(2, VOCAB, (n,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids.tolist()}


def windows(samples):
    """Each sample cut into rows of W tokens, the last one padded."""
    rows = []
    for s in samples:
        ids = s["input_ids"]
        rows += [ids[j:j + W] + [0] * (W - len(ids[j:j + W])) for j in range(0, len(ids), W)]
    x = torch.tensor(rows)
    return {"input_ids": x, "labels": x.clone()}


def gpt2():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=W, n_embd=64, n_layer=2, n_head=4))


def arguments(tmp_path, batch, steps):
    # In order: the first batch, the one measured, holds short samples.
    return transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        per_device_train_batch_size=batch, max_steps=steps, train_sampling_strategy="sequential")


def set_then_trained(tmp_path, samples, longest, collator):
    """The plan's notes of the batch FitBatchSize sets on `samples` (a first
    batch of 64), after the Trainer's own steps at that batch ran on
    `longest` (an out-of-memory error fails the test): the truth."""
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        fit = FitBatchSize()
        args = arguments(tmp_path, 64, 1)
        transformers.Trainer(model=gpt2(), args=args, train_dataset=samples,
                             data_collator=collator, callbacks=[fit])
    batch, notes = args.per_device_train_batch_size, list(fit.plan.notes)
    fit = None
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        trainer = transformers.Trainer(model=gpt2(), args=arguments(tmp_path, batch, 2),
                                       train_dataset=longest, data_collator=collator)
        trainer.train()
        trainer = None
    return notes


def test_the_batch_counts_the_rows_the_longest_sample_gives(tmp_path):
    # The truth: every sample WINDOWS rows.
    notes = set_then_trained(tmp_path, Texts(), Texts(only=WINDOWS * W), windows)
    assert any(f"{WINDOWS} rows of {W}" in note for note in notes), notes
