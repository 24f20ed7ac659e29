"""The Hugging Face FitBatchSize with lengths= on seq2seq data: sources of
16 tokens, targets padded apart from them (DataCollatorForSeq2Seq), one
target longer than the rest. The fit per length resized input_ids alone
and kept the first batch's short targets: it said 78 at 16 tokens, and
the Trainer's own steps at 78 ran out of memory at the batch holding that
target (in one epoch of its own sampler too). The truth is the Trainer's
own steps on a simulated device of the budget, every target that long."""

import gc

import pytest

import memfit
from memfit._native import tracked_live_bytes

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

from test_transformers_seq2seq_longest_labels import LONG, SOURCE, Pairs, pad, t5  # noqa: E402
from test_transformers_seq2seq_longest_labels import arguments as seq2seq_arguments  # noqa: E402

transformers.logging.set_verbosity_error()
N, BUDGET = 64, 16 << 20
SEQ_DIM = {"input_ids": 1, "attention_mask": 1}
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


def arguments(tmp_path, batch, steps):
    # In order: the first batch, the one measured, holds short targets.
    return seq2seq_arguments(tmp_path, batch, steps, train_sampling_strategy="sequential")


def test_each_length_is_fitted_with_the_longest_target(tmp_path):
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        fit = FitBatchSize(seq_dim=SEQ_DIM, lengths=[SOURCE])
        transformers.Trainer(model=t5(), args=arguments(tmp_path, 8, 1), train_dataset=Pairs(n=N),
                             data_collator=pad, callbacks=[fit])
    batch = fit.length_fit.at(SOURCE)
    assert any(f"a training sample's {LONG}" in note for note in fit.plan.notes)
    fit = None
    # The truth: the Trainer's own steps at the batch said to fit, every
    # target LONG.
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        trainer = transformers.Trainer(
            model=t5(), args=arguments(tmp_path, batch, 2), data_collator=pad,
            train_dataset=Pairs(only=LONG, n=N))
        trainer.train()  # an out-of-memory error fails the test
        trainer = None
