"""The HF FitBatchSize(lengths=) under several processes: accelerate wraps
the LengthBatchSampler in a BatchSamplerShard, and the loader's set_epoch,
which the HF Trainer calls at each epoch, stopped there: every epoch gave
epoch 0's batches in epoch 0's order (the Trainer's own sampler reshuffles
each epoch). Two processes are imitated by accelerate's own
prepare_data_loader with num_processes=2."""

import pytest
import torch

import memfit

transformers = pytest.importorskip("transformers")
accelerate_loader = pytest.importorskip("accelerate.data_loader")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

transformers.logging.set_verbosity_error()
VOCAB = 64
LENGTHS = [4 + (i * 7) % 28 for i in range(120)]
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


class Causal(torch.utils.data.Dataset):
    def __len__(self):
        return len(LENGTHS)

    def __getitem__(self, i):
        ids = torch.randint(2, VOCAB, (LENGTHS[i],), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def pad(samples):
    ids = torch.nn.utils.rnn.pad_sequence([s["input_ids"] for s in samples], batch_first=True)
    labels = torch.nn.utils.rnn.pad_sequence([s["labels"] for s in samples], batch_first=True,
                                             padding_value=-100)
    return {"input_ids": ids, "attention_mask": (labels != -100).long(), "labels": labels}


def test_each_epoch_reaches_the_length_sampler_through_accelerates_shard(tmp_path):
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=32,
        bos_token_id=0, eos_token_id=1))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        per_device_train_batch_size=8)
    fit = FitBatchSize(budget="3MiB", seq_dim=1, lengths=[8, 32])
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Causal(),
                                   data_collator=pad, callbacks=[fit])
    trainer.accelerator.prepare = lambda loader: accelerate_loader.prepare_data_loader(
        loader, num_processes=2, process_index=0, put_on_device=False)
    loader = trainer.get_train_dataloader()
    assert isinstance(loader.batch_sampler, accelerate_loader.BatchSamplerShard)
    orders = []
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        orders.append([b["input_ids"].shape[0] for b in loader])
        assert fit.sampler.epoch == epoch
    expected = []
    for epoch in (0, 1):
        fit.sampler.set_epoch(epoch)
        expected.append([len(b) for b in fit.sampler])
    assert orders == expected and expected[0] != expected[1]
    assert isinstance(fit.sampler, memfit.LengthBatchSampler)
