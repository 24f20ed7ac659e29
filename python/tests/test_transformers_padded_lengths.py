"""The Hugging Face FitBatchSize on data padded per batch (a collator that
pads to each batch's longest sample): the first batch the callback measures
is only as long as its samples, and the batch it sets must still run the
Trainer's own steps on the longest samples of the training set."""

import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

transformers.logging.set_verbosity_error()
VOCAB, SHORT, LONG, N = 128, 12, 64, 2048
BUDGET = 16 << 20
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


class Texts(torch.utils.data.Dataset):
    """Samples of SHORT tokens, but for the last one, LONG (or all of `only`)."""

    def __init__(self, only=None):
        self.only = only

    def __len__(self):
        return N

    def __getitem__(self, i):
        n = self.only or (LONG if i == N - 1 else SHORT)
        ids = torch.randint(2, VOCAB, (n,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids.tolist(), "labels": i % 2}


def pad(samples):
    """Padded to the batch's longest sample, as DataCollatorWithPadding."""
    n = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), n, dtype=torch.long)
    mask = torch.zeros(len(samples), n, dtype=torch.long)
    for i, s in enumerate(samples):
        ids[i, :len(s["input_ids"])] = torch.tensor(s["input_ids"])
        mask[i, :len(s["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask,
            "labels": torch.tensor([s["labels"] for s in samples])}


def bert():
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=256, max_position_embeddings=LONG, attn_implementation="eager",
        num_labels=2))


def arguments(tmp_path, batch, steps):
    return transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        per_device_train_batch_size=batch, max_steps=steps)


def test_the_batch_fitted_on_a_short_first_batch_runs_the_longest_samples(tmp_path):
    with memfit.simulated_device(BUDGET):
        fit = FitBatchSize()
        args = arguments(tmp_path, 32, 1)
        transformers.Trainer(model=bert(), args=args, train_dataset=Texts(), data_collator=pad,
                             callbacks=[fit])
    batch = args.per_device_train_batch_size
    assert any(f"a training sample {LONG}" in note for note in fit.plan.notes), fit.plan.notes
    fit = None
    # The truth: the Trainer's own steps at that batch, every sample LONG.
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        trainer = transformers.Trainer(model=bert(), args=arguments(tmp_path, batch, 2),
                                       train_dataset=Texts(only=LONG), data_collator=pad)
        trainer.train()  # an out-of-memory error fails the test
        trainer = None
