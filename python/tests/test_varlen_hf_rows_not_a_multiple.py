"""The Hugging Face FitBatchSize with a data collator that tokenizes texts
into windows of W tokens: texts of W and 2 W characters, one or two rows
each, so the first batch holds 96 rows for 64 texts, not a whole multiple.
The callback took it as one row a text and set the batch to the rows that
fit; the Trainer's own steps at that batch, every text two windows, ran
out of memory. The truth is the Trainer's own steps on a simulated device
of the budget."""

import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

transformers.logging.set_verbosity_error()
VOCAB, N, W = 128, 256, 32
BUDGET = 24 << 20
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


class Texts(torch.utils.data.Dataset):
    """Texts of W characters, every other one 2 W (or every one `only`)."""

    def __init__(self, only=None):
        self.only = only

    def __len__(self):
        return N

    def __getitem__(self, i):
        n = self.only or (2 * W if i % 2 else W)
        return "".join(chr(97 + (i * 7 + j) % 26) for j in range(n))


def windows(texts):
    """Each text's characters as ids, cut into rows of W."""
    rows = [[ord(c) for c in t[j:j + W]] for t in texts for j in range(0, len(t), W)]
    x = torch.tensor([r + [0] * (W - len(r)) for r in rows])
    return {"input_ids": x, "labels": x.clone()}


def gpt2():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=W, n_embd=64, n_layer=2, n_head=4))


def arguments(tmp_path, batch, steps):
    return transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        per_device_train_batch_size=batch, max_steps=steps, train_sampling_strategy="sequential")


def test_a_first_batch_of_rows_not_a_multiple_of_its_samples_is_rounded_up(tmp_path):
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        fit = FitBatchSize()
        args = arguments(tmp_path, 64, 1)
        transformers.Trainer(model=gpt2(), args=args, train_dataset=Texts(),
                             data_collator=windows, callbacks=[fit])
    batch = args.per_device_train_batch_size
    assert any("2 rows a sample" in note for note in fit.plan.notes), fit.plan.notes
    fit = None
    # The truth: the Trainer's own steps at that batch, every text 2 W.
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        trainer = transformers.Trainer(model=gpt2(), args=arguments(tmp_path, batch, 2),
                                       train_dataset=Texts(only=2 * W), data_collator=windows)
        trainer.train()  # an out-of-memory error fails the test
        trainer = None
