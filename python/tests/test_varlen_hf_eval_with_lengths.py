"""The HF FitBatchSize(lengths=) sizes the evaluation batch, as it does
without lengths=: it left per_device_eval_batch_size as the user set it
(512), and the Trainer's evaluation during training ran out of memory at
it beside the training's optimizer state. The truth is the Trainer's own
train() with an evaluation, on a simulated device of the budget."""

import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

from test_transformers_length_sampler_epochs import pad  # noqa: E402

transformers.logging.set_verbosity_error()
VOCAB, LONG, BUDGET = 128, 32, 8 << 20
LENGTHS = [8 + (i * 7) % 25 for i in range(256)]
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


class Causal(torch.utils.data.Dataset):
    """Samples of LENGTHS tokens (or every one `only`)."""

    def __init__(self, only=None):
        self.only = only

    def __len__(self):
        return len(LENGTHS)

    def __getitem__(self, i):
        n = self.only or LENGTHS[i]
        ids = torch.randint(2, VOCAB, (n,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def test_the_evaluation_batch_is_sized_with_lengths(tmp_path):
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=LONG))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        per_device_train_batch_size=8, per_device_eval_batch_size=512, max_steps=1,
        eval_strategy="steps", eval_steps=1)
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        fit = FitBatchSize(seq_dim=1, lengths=[8, LONG])
        trainer = transformers.Trainer(model=model, args=args, train_dataset=Causal(),
                                       eval_dataset=Causal(only=LONG), data_collator=pad,
                                       callbacks=[fit])
        assert fit.plan.eval_batch_size == args.per_device_eval_batch_size < 512
        trainer.train()  # an out-of-memory error, in the evaluation too, fails the test
        trainer = None
