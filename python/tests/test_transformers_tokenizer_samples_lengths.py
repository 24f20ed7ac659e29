"""Each sample's length, read for the Hugging Face FitBatchSize(lengths=),
from what a tokenizer returns per sample: a BatchEncoding (a mapping that
is not a dict) of lists, whose length was read as its number of keys (2),
or of (1, L) tensors (tokenizer(text, return_tensors="pt"), concatenated
by the collate function), read as 1. Either way the sampler gave a
64-token batch the batch that fits at 16 and the Trainer's own step ran
out of memory. The truth is the Trainer's own loop on a simulated device
of the budget."""

import gc
import math

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

transformers = pytest.importorskip("transformers")
from memfit.integrations.length_batches import sample_lengths  # noqa: E402
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

transformers.logging.set_verbosity_error()
VOCAB, LONGEST = 128, 64
_g = torch.Generator().manual_seed(0)
LENGTHS = [int(v) for v in torch.empty(300).log_normal_(math.log(20), 0.7, generator=_g)
           .clamp(4, LONGEST).round()]
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


def ids_of(i):
    return torch.randint(2, VOCAB, (LENGTHS[i],), generator=torch.Generator().manual_seed(i))


class Lists(torch.utils.data.Dataset):
    """What tokenizer(text) gives per sample: a BatchEncoding of lists."""

    def __len__(self):
        return len(LENGTHS)

    def __getitem__(self, i):
        ids = ids_of(i).tolist()
        return transformers.BatchEncoding({"input_ids": ids, "attention_mask": [1] * len(ids)})


class Tensors(Lists):
    """What tokenizer(text, return_tensors="pt") gives: (1, L) tensors."""

    def __getitem__(self, i):
        ids = ids_of(i)[None]
        return transformers.BatchEncoding({"input_ids": ids,
                                           "attention_mask": torch.ones_like(ids)})


def pad(samples):
    rows = [torch.as_tensor(s["input_ids"]).flatten() for s in samples]
    n = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), n, dtype=torch.long)
    labels = torch.full((len(rows), n), -100)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = labels[i, :len(r)] = r
    return {"input_ids": ids, "attention_mask": (labels != -100).long(), "labels": labels}


@pytest.mark.parametrize("dataset, batch_dims", [(Lists, None), (Tensors, 2)])
def test_a_tokenizers_samples_are_read_by_their_input_ids(dataset, batch_dims):
    # batch_dims: the dimensions of a batch the loader gave (a (1, L) sample
    # keeps a batch dimension of its own).
    assert sample_lengths(dataset(), 1, None, "t", batch_dims=batch_dims) == LENGTHS
    pair = [(transformers.BatchEncoding({"input_ids": [3] * n}), 0) for n in (5, 9)]
    assert sample_lengths(pair, 1, None, "t") == [5, 9]


@pytest.mark.parametrize("dataset", [Lists, Tensors])
def test_the_hf_trainer_batched_by_length_over_tokenizer_samples_never_runs_out(tmp_path,
                                                                                dataset):
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=LONGEST,
        attn_implementation="eager", bos_token_id=0, eos_token_id=1))
    gc.collect()  # a device of 3 MiB beside what earlier tests left tracked
    with memfit.simulated_device((3 << 20) + tracked_live_bytes("cpu")):
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
            logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0, max_steps=6,
            per_device_train_batch_size=8)
        fit = FitBatchSize(seq_dim=1, lengths=[16, 32, 64])
        trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset(),
                                       data_collator=pad, callbacks=[fit])
        assert fit.sampler.lengths == LENGTHS
        trainer.train()  # the Trainer's own loop: an OOM would raise
        assert trainer.state.global_step == 6
    model = trainer = None
