"""The HF FitBatchSize(lengths=) with train_sampling_strategy="sequential":
the Trainer's own loader gives the samples in dataset order, the same every
epoch; the LengthBatchSampler memfit put in its place shuffled them, each
epoch another order (Lightning's loader without shuffle kept its order).
Now the batches are built from the dataset order, grouped by length, the
same each epoch, and every sample comes once."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

from test_transformers_length_sampler_epochs import LENGTHS, VOCAB, pad  # noqa: E402

transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


class Causal(torch.utils.data.Dataset):
    """Sample i's first token is i (its identity in a batch)."""

    def __len__(self):
        return len(LENGTHS)

    def __getitem__(self, i):
        ids = torch.randint(2, VOCAB, (LENGTHS[i],), generator=torch.Generator().manual_seed(i))
        ids[0] = 200 + i
        return {"input_ids": ids, "labels": ids}


def epochs(loader, n=2):
    out = []
    for epoch in range(n):
        loader.set_epoch(epoch)
        out.append([[int(v) - 200 for v in b["input_ids"][:, 0]] for b in loader])
    return out


def test_a_sequential_trainer_keeps_one_order_every_epoch(tmp_path):
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB + 200 + len(LENGTHS),
        n_positions=32, bos_token_id=0, eos_token_id=1))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        per_device_train_batch_size=8, train_sampling_strategy="sequential")
    fit = FitBatchSize(budget="3MiB", seq_dim=1, lengths=[8, 32])
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Causal(),
                                   data_collator=pad, callbacks=[fit])
    first, second = epochs(trainer.get_train_dataloader())
    assert first == second
    assert sorted(i for b in first for i in b) == list(range(len(LENGTHS)))
