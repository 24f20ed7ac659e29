"""Each sample's length, read for the Hugging Face FitBatchSize(lengths=),
from samples that keep a batch dimension of their own: tokenizer(text,
return_tensors="pt") gives input_ids of shape (1, L), and the collate
function concatenates them. Read as a sample without one, every length
was 1, the sampler gave a 64-token batch the batch that fits at 16, and
the Trainer's own step ran out of memory. The truth is the Trainer's own
loop on a simulated device of the budget."""

import gc
import math

import pytest
import torch

import memfit

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

transformers.logging.set_verbosity_error()
VOCAB, LONGEST = 128, 64
_g = torch.Generator().manual_seed(0)
LENGTHS = [int(v) for v in torch.empty(300).log_normal_(math.log(20), 0.7, generator=_g)
           .clamp(4, LONGEST).round()]
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


class Tokenized(torch.utils.data.Dataset):
    """What tokenizer(text, return_tensors="pt") gives per sample."""

    def __len__(self):
        return len(LENGTHS)

    def __getitem__(self, i):
        ids = torch.randint(2, VOCAB, (1, LENGTHS[i]), generator=torch.Generator().manual_seed(i))
        return transformers.BatchEncoding({"input_ids": ids,
                                           "attention_mask": torch.ones_like(ids)})


def pad(samples):
    n = max(s["input_ids"].shape[1] for s in samples)
    ids = torch.cat([torch.nn.functional.pad(s["input_ids"], (0, n - s["input_ids"].shape[1]))
                     for s in samples])
    mask = torch.cat([torch.nn.functional.pad(s["attention_mask"],
                                              (0, n - s["input_ids"].shape[1]))
                      for s in samples])
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def test_samples_of_shape_1_by_length_are_read_by_their_length_and_never_run_out(tmp_path):
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=LONGEST,
        attn_implementation="eager", bos_token_id=0, eos_token_id=1))
    gc.collect()
    with memfit.simulated_device("3MiB"):
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
            logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0, max_steps=6,
            per_device_train_batch_size=8)
        fit = FitBatchSize(seq_dim=1, lengths=[16, 32, 64])
        trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokenized(),
                                       data_collator=pad, callbacks=[fit])
        assert fit.sampler.lengths == LENGTHS
        trainer.train()  # the Trainer's own loop: an OOM would raise
        assert trainer.state.global_step == 6
    model = trainer = None
