"""A fit per length on an example batch without padding (samples of one
length) is held to batches padded to their longest sample: a model that
builds its attention mask only where there is padding (Llama's and BERT's
SDPA paths expand it to (batch, 1, L, L)) takes more on them. The fit pads the
example's attention_mask. The truth is plain training steps on a simulated
device of the budget, not memfit."""

import pytest
import torch

import memfit
from memfit.testing.truth import loop_body, plain_steps_run

transformers = pytest.importorskip("transformers")

BUDGET = 8 << 20
VOCAB = 100


def llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1,
                                      intermediate_size=64, max_position_embeddings=128)
    return transformers.LlamaForCausalLM(config)


def padded_batch(batch, length):
    """`batch` samples padded to `length`, the first that long, the others
    shorter, as a collate function pads them."""
    g = torch.Generator().manual_seed(batch * 1000 + length)
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    lengths[0] = length
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    ids = torch.randint(1, VOCAB, (batch, length), generator=g) * mask
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def runs(batch, length):
    """Plain steps (the quickstart loop) on padded batches."""
    def build():
        model = llama()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        return model, opt, padded_batch(batch, length), {}

    def step(model, opt, x, kept):
        loop_body(lambda b: model(**b), opt, x, None, lambda out, _: out.loss, kept)
    return plain_steps_run(BUDGET, build, step)


def test_an_example_without_padding_is_fitted_as_a_padded_batch():
    torch.manual_seed(0)
    example = padded_batch(4, 24)
    example["attention_mask"] = torch.ones_like(example["attention_mask"])  # no padding
    example["labels"] = example["input_ids"].clone()
    fit = memfit.find_batch_size(llama(), example, optimizer="adam", budget=BUDGET, seq_dim=1,
                                 lengths=[16, 64])
    # Fitted without padding, at(40) was 31 and at(64) 19: padded batches
    # ran out at both.
    for n in (40, 64):
        assert runs(fit.at(n), n), (n, fit.at(n))
    assert any("attention_mask has no padding" in n for n in fit.notes), fit.notes
    assert not runs(fit.at(64) + 1, 64)  # what fits, not below it
