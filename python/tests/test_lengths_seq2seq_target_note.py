"""A fit per length resizes what seq_dim names; an encoder-decoder's labels
have a length of their own, and a per-input seq_dim that leaves them out
fits every length with the example's target. Plain steps whose targets are
longer run out of memory at the batch the fit says fits, and the fit was
verified with no word of it. The fit now says which inputs keep the
example's shape, and what to do: an example whose target is as long as
the data's longest gives a batch plain steps run. The truth is plain
training steps on a simulated device of the budget."""

import pytest
import torch

import memfit
from memfit.testing.truth import plain_steps_run

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
BUDGET = 16 << 20
SEQ_DIM = {"input_ids": 1, "attention_mask": 1}
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


def t5():
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0))


def batch(b, source, target):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 128, (b, source), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "labels": torch.randint(2, 128, (b, target), generator=g)}


def fit_with_target(target):
    model = t5()
    return memfit.find_batch_size(model, batch(4, 16, target), None,
                                  optimizer=torch.optim.AdamW(model.parameters()),
                                  budget=BUDGET, seq_dim=SEQ_DIM, lengths=[16, 64])


def runs(b, source, target):
    def build():
        model = t5()
        return model, torch.optim.AdamW(model.parameters()), batch(b, source, target)

    def step(model, opt, data):
        model(**data).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return plain_steps_run(BUDGET, build, step)


@pytest.mark.slow
def test_inputs_left_at_the_examples_length_are_named_and_a_long_example_target_fits():
    short = fit_with_target(8)
    assert any("not resized with the length" in n and "labels (4, 8)" in n for n in short.notes)
    assert runs(short.at(64), 64, 8) and not runs(short.at(64), 64, 64)
    longest = fit_with_target(64)
    assert runs(longest.at(64), 64, 64) and runs(longest.at(16), 16, 64)
