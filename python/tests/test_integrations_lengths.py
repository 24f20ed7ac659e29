"""Variable-length data in the frameworks' own loops: the Hugging Face
Trainer and Lightning train on their dataset batched by a LengthBatchSampler
fitted from their own step, under the simulated device with no
out-of-memory error; with tokens_per_step the HF Trainer's optimizer steps
each hold about that many tokens through gradient accumulation."""

import gc
import math

import pytest
import torch

import memfit

VOCAB, LONGEST = 128, 64
LENGTHS = [16, 32, 64]


def long_tailed(n, seed=0, low=4, high=LONGEST):
    g = torch.Generator().manual_seed(seed)
    drawn = torch.empty(n).log_normal_(math.log(20), 0.7, generator=g)
    return [int(v) for v in drawn.clamp(low, high).round()]


SAMPLE_LENGTHS = long_tailed(400)
POOL = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(i))
        for i, n in enumerate(SAMPLE_LENGTHS)]


pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


# -- the Hugging Face Trainer ------------------------------------------------------


class Causal(torch.utils.data.Dataset):
    """Causal-LM samples of long-tailed lengths (labels = input_ids)."""

    def __len__(self):
        return len(POOL)

    def __getitem__(self, i):
        return {"input_ids": POOL[i], "labels": POOL[i]}


def pad_dict(samples):
    ids = torch.nn.utils.rnn.pad_sequence([s["input_ids"] for s in samples], batch_first=True)
    labels = torch.nn.utils.rnn.pad_sequence([s["labels"] for s in samples], batch_first=True,
                                             padding_value=-100)
    return {"input_ids": ids, "attention_mask": (labels != -100).long(), "labels": labels}


@pytest.mark.slow
def test_the_hf_trainer_batched_by_length_keeps_tokens_per_step_and_never_runs_out(tmp_path):
    transformers = pytest.importorskip("transformers")
    from memfit.integrations.transformers import FitBatchSize

    class Counting(transformers.Trainer):
        def training_step(self, model, inputs, *args, **kwargs):
            self.shapes = getattr(self, "shapes", []) + [tuple(inputs["input_ids"].shape)]
            return super().training_step(model, inputs, *args, **kwargs)

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=LONGEST,
        attn_implementation="eager", bos_token_id=0, eos_token_id=1))
    tokens = 1024
    gc.collect()
    with memfit.simulated_device("3MiB"):
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
            logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0, max_steps=4,
            per_device_train_batch_size=8, gradient_accumulation_steps=1)
        fit = FitBatchSize(seq_dim=1, lengths=LENGTHS, tokens_per_step=tokens)
        trainer = Counting(model=model, args=args, train_dataset=Causal(),
                           data_collator=pad_dict, callbacks=[fit])
        k = args.gradient_accumulation_steps
        assert k == math.ceil(tokens / fit.length_fit.max_tokens) and k > 1, fit.length_fit
        trainer.train()  # the Trainer's own loop: an OOM would raise
        assert trainer.state.global_step == 4
    shapes = trainer.shapes
    assert len(shapes) == 4 * k
    for b, n in shapes:  # each micro-batch fits at its padded length
        assert b <= fit.length_fit.at(n) and b * n <= tokens // k
    # Tokens per optimizer step, padded: near what was asked, whatever the lengths.
    per_step = [sum(b * n for b, n in shapes[i:i + k]) for i in range(0, len(shapes), k)]
    assert all(0.75 * tokens <= t <= tokens for t in per_step), per_step
    assert len({n for _, n in shapes}) > 2  # the lengths did vary
    model = trainer = None


def test_the_hf_callback_refuses_length_options_without_lengths():
    pytest.importorskip("transformers")
    from memfit.integrations.transformers import FitBatchSize

    with pytest.raises(ValueError, match=r"^\[FitBatchSize\] lengths= needs seq_dim="):
        FitBatchSize(lengths=[16, 32])
    with pytest.raises(ValueError, match=r"^\[FitBatchSize\] seq_dim=, sample_lengths= and "
                       r"tokens_per_step= batch by length, and need lengths="):
        FitBatchSize(tokens_per_step=4096)


# -- Lightning ---------------------------------------------------------------------


def pad_pair(samples):
    x = torch.nn.utils.rnn.pad_sequence(samples, batch_first=True)
    y = torch.nn.utils.rnn.pad_sequence(samples, batch_first=True, padding_value=-100)
    return x, y


class PadToMultiple:
    """pad_pair rounded up to a multiple, as DataCollatorWithPadding(
    pad_to_multiple_of=24) pads: a batch runs longer than its samples."""

    pad_to_multiple_of = 24

    def __call__(self, samples):
        x, y = pad_pair(samples)
        extra = -x.shape[1] % self.pad_to_multiple_of
        return (torch.nn.functional.pad(x, (0, extra)),
                torch.nn.functional.pad(y, (0, extra), value=-100))


def lightning_tagger(batch_size=8, collate_fn=pad_pair):
    pl = pytest.importorskip("lightning.pytorch")

    class Tagger(pl.LightningModule):
        """An LSTM tagger over a padded token dataset of long-tailed lengths,
        batch_size samples per batch as the user wrote it."""

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.tok = torch.nn.Embedding(VOCAB, 32)
            self.lstm = torch.nn.LSTM(32, 64, batch_first=True)
            self.head = torch.nn.Linear(64, VOCAB)
            self.shapes = []

        def on_train_batch_start(self, batch, batch_idx):  # the loop's, not memfit's probes
            self.shapes.append(tuple(batch[0].shape))

        def training_step(self, batch, batch_idx):
            x, y = batch
            out = self.head(self.lstm(self.tok(x))[0])
            return torch.nn.functional.cross_entropy(out.flatten(0, 1), y.flatten(),
                                                     ignore_index=-100)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(POOL, batch_size=batch_size, shuffle=True,
                                               collate_fn=collate_fn)

    return pl, Tagger()


def lightning_fit_by_length(collate_fn=pad_pair):
    """(trainer, module, callback): 12 steps of Lightning's own loop under a
    4 MiB simulated device (an OOM would raise), batched by length."""
    pl, module = lightning_tagger(collate_fn=collate_fn)
    from memfit.integrations.lightning import FitBatchSize

    fit = FitBatchSize(seq_dim=1, lengths=LENGTHS)
    gc.collect()
    with memfit.simulated_device("4MiB"):
        trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, max_steps=12,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, callbacks=[fit])
        trainer.fit(module)
    return trainer, module, fit


@pytest.mark.slow
def test_lightnings_loop_trains_on_its_dataloader_batched_by_length_with_no_oom():
    trainer, module, fit = lightning_fit_by_length()
    assert trainer.global_step == 12 and len(module.shapes) == 12
    lengths = fit.length_fit
    assert isinstance(fit.sampler, memfit.LengthBatchSampler)
    for b, n in module.shapes:  # the sampler's batches, each fitting at its length
        assert b <= lengths.at(n)
    # Far more than the 8 samples the module's own loader gave per batch.
    assert sum(b for b, _ in module.shapes) > 8 * 12 * 2
    assert "train_dataloader" not in vars(module)  # the module's own loader again


@pytest.mark.slow
def test_lightning_with_a_collate_that_pads_to_a_multiple_sizes_each_batch_at_its_padded_length():
    trainer, module, fit = lightning_fit_by_length(PadToMultiple())
    # No batch runs at 16 or 64 tokens: each length is fitted where batches run.
    assert fit.length_fit.lengths == [24, 48, 72]
    assert fit.sampler.pad_to_multiple_of == 24
    assert trainer.global_step == 12
    for b, n in module.shapes:
        assert n % 24 == 0 and b <= fit.length_fit.at(n), (b, n)


def test_the_lightning_callback_refuses_a_sample_count_beside_lengths():
    pytest.importorskip("lightning.pytorch")
    from memfit.integrations.lightning import FitBatchSize

    with pytest.raises(ValueError, match=r"^\[FitBatchSize\] keep_effective_batch= counts "
                       r"samples, .* pass tokens_per_step="):
        FitBatchSize(seq_dim=1, lengths=[16, 32], keep_effective_batch=64)
