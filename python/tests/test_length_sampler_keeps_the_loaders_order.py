"""The loader batched by length keeps what the user's loader said: a
Lightning loader without shuffle stays in dataset order (grouped by
length), and drop_last=True (Lightning's loader, the HF Trainer's
dataloader_drop_last) drops the one short batch of the epoch. Before, the
LengthBatchSampler shuffled and kept the short batch whatever the loader
said: a batch of one sample reached a model that cannot take one."""

import gc
import math

import pytest
import torch

import memfit

pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py
VOCAB = 64
_g = torch.Generator().manual_seed(0)
LENGTHS = [int(v) for v in torch.empty(203).log_normal_(math.log(20), 0.7, generator=_g)
           .clamp(4, 64).round()]
POOL = [torch.randint(0, VOCAB, (n,), generator=_g) for n in LENGTHS]


def pad_pair(samples):
    x = torch.nn.utils.rnn.pad_sequence(samples, batch_first=True)
    return x, torch.nn.utils.rnn.pad_sequence(samples, batch_first=True, padding_value=-100)


@pytest.mark.slow
def test_lightnings_loader_without_shuffle_and_with_drop_last_is_kept():
    pl = pytest.importorskip("lightning.pytorch")
    from memfit.integrations.lightning import FitBatchSize

    class Tagger(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.tok = torch.nn.Embedding(VOCAB, 16)
            self.head = torch.nn.Linear(16, VOCAB)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.head(self.tok(x)).flatten(0, 1),
                                                     y.flatten(), ignore_index=-100)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(POOL, batch_size=8, shuffle=False,
                                               drop_last=True, collate_fn=pad_pair)

    fit = FitBatchSize(seq_dim=1, lengths=[16, 64])
    gc.collect()
    with memfit.simulated_device("2MiB"):
        trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, max_steps=1,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, callbacks=[fit])
        trainer.fit(Tagger())
    sampler = fit.sampler
    assert not sampler.shuffle and sampler.drop_last
    batches = list(sampler)
    caps = [sampler.capacity(max(LENGTHS[i] for i in b)) for b in batches]
    assert all(len(b) == cap for b, cap in zip(batches, caps))  # no short batch
    # The same batches as a sampler in dataset order would give, every epoch.
    sampler.set_epoch(1)
    assert list(sampler) == batches


def test_the_hf_trainers_dataloader_drop_last_reaches_the_length_sampler(tmp_path):
    transformers = pytest.importorskip("transformers")
    from memfit.integrations.transformers import FitBatchSize

    transformers.logging.set_verbosity_error()

    class Causal(torch.utils.data.Dataset):
        def __len__(self):
            return len(POOL)

        def __getitem__(self, i):
            return {"input_ids": POOL[i], "labels": POOL[i]}

    def pad_dict(samples):
        ids, labels = pad_pair([s["input_ids"] for s in samples])
        return {"input_ids": ids, "attention_mask": (labels != -100).long(), "labels": labels}

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=64,
        bos_token_id=0, eos_token_id=1))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        per_device_train_batch_size=8, dataloader_drop_last=True)
    fit = FitBatchSize(budget="3MiB", seq_dim=1, lengths=[16, 64])
    transformers.Trainer(model=model, args=args, train_dataset=Causal(), data_collator=pad_dict,
                         callbacks=[fit])
    assert fit.sampler.drop_last
    for b in fit.sampler:
        assert len(b) == fit.sampler.capacity(max(LENGTHS[i] for i in b))
