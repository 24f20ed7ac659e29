"""The Hugging Face FitBatchSize with TrainingArguments(gradient_checkpointing=
True): train() turns checkpointing on after the callback planned, and the
batch set is the one the Trainer's checkpointed loop runs, not the one a
step keeping every activation runs. The model is left as it was."""

import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

transformers.logging.set_verbosity_error()
VOCAB, LENGTH, BUDGET = 128, 64, 16 << 20
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


class Texts(torch.utils.data.Dataset):
    def __len__(self):
        return 1024

    def __getitem__(self, i):
        ids = torch.randint(2, VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "attention_mask": torch.ones(LENGTH, dtype=torch.long),
                "labels": torch.tensor(i % 2)}


def bert():
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=256, max_position_embeddings=LENGTH, attn_implementation="eager",
        num_labels=2))


def arguments(tmp_path, batch, steps, checkpointing):
    return transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        per_device_train_batch_size=batch, max_steps=steps,
        gradient_checkpointing=checkpointing)


def loop_runs(tmp_path, batch, checkpointing):
    """The Trainer's own loop, 2 steps at `batch`, on the simulated device."""
    gc.collect()
    try:
        with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
            trainer = transformers.Trainer(model=bert(), train_dataset=Texts(),
                                           args=arguments(tmp_path, batch, 2, checkpointing))
            trainer.train()
            trainer = None
        return True
    except torch.OutOfMemoryError:
        return False


def test_the_batch_is_fitted_with_the_checkpointing_train_turns_on(tmp_path):
    args = arguments(tmp_path, 20, 2, True)
    model = bert()
    with memfit.simulated_device(BUDGET):
        transformers.Trainer(model=model, args=args, train_dataset=Texts(),
                             callbacks=[FitBatchSize()])
    assert not model.is_gradient_checkpointing and not hasattr(model, "_require_grads_hook")
    batch = args.per_device_train_batch_size
    model = None
    assert loop_runs(tmp_path, batch, checkpointing=True)
    # The checkpointing counted: without it that batch runs out of memory.
    assert not loop_runs(tmp_path, batch, checkpointing=False), batch


def test_a_transformers_whose_enable_takes_only_the_kwargs_is_fitted_the_same(tmp_path):
    # transformers 4 has gradient_checkpointing_enable(gradient_checkpointing_kwargs)
    # alone: the callback passes every_n_layers= and offload= only where taken.
    args = arguments(tmp_path, 20, 2, True)
    model = bert()
    enable = model.gradient_checkpointing_enable

    def older(gradient_checkpointing_kwargs=None):
        return enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)

    model.gradient_checkpointing_enable = older
    with memfit.simulated_device(BUDGET):
        transformers.Trainer(model=model, args=args, train_dataset=Texts(),
                             callbacks=[FitBatchSize()])
    assert not model.is_gradient_checkpointing
    fitted = args.per_device_train_batch_size
    model = None
    args = arguments(tmp_path, 20, 2, True)
    with memfit.simulated_device(BUDGET):
        transformers.Trainer(model=bert(), args=args, train_dataset=Texts(),
                             callbacks=[FitBatchSize()])
    assert fitted == args.per_device_train_batch_size
