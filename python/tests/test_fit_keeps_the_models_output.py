"""The user's loop usually keeps the model's output until the next forward
replaces it: PyTorch's quickstart `pred = model(X); loss = loss_fn(pred,
y)`, Hugging Face's `outputs = model(**batch)`. For a language model the
logits are the largest tensor. find_batch_size fits that loop by default
(keep_output=True), and the one-line loop `loss_fn(model(x),
y).backward()`, which drops them once the loss exists, with
keep_output=False (Note [The order of a training iteration], report.h).
Truth: plain steps of each loop, written as a user writes it, on the
simulated device."""

import gc

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit._native import tracked_live_bytes
from memfit.testing.truth import largest_that_fits, loop_body, plain_steps_run

BUDGET = 8 << 20
VOCAB, LENGTH = 500, 16


class TiedLM(torch.nn.Module):
    """Embedding and output head share one weight: the logits dominate."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 64)
        self.hidden = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        return self.head(torch.tanh(self.hidden(self.emb(x)))).flatten(0, 1)


def _loss(pred, y):
    return F.cross_entropy(pred, y.flatten())


def _runs(n, keeps_pred):
    """Three iterations of the loop. `loop` holds what a for-loop's body
    keeps from one iteration to the next: `pred` and `loss` until they are
    assigned again."""
    def build():
        model = TiedLM()
        return model, torch.optim.Adam(model.parameters()), {}

    def step(model, opt, loop):
        x, y = torch.randint(0, VOCAB, (n, LENGTH)), torch.randint(0, VOCAB, (n, LENGTH))
        loop_body(model, opt, x, y, _loss, loop if keeps_pred else None)
    return plain_steps_run(BUDGET, build, step, steps=3)


def _fit(**loop):
    gc.collect()
    torch.manual_seed(0)
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        model = TiedLM()
        opt = torch.optim.Adam(model.parameters())
        x, y = torch.randint(0, VOCAB, (8, LENGTH)), torch.randint(0, VOCAB, (8, LENGTH))
        return memfit.find_batch_size(model, x, y, loss_fn=_loss, optimizer=opt, **loop)


@pytest.mark.parametrize("keeps_pred", [True, False], ids=["quickstart", "one-line"])
def test_the_answer_runs_the_loop_it_was_fitted_for_and_is_close_to_its_largest(keeps_pred):
    fit = _fit() if keeps_pred else _fit(keep_output=False)
    assert fit.verified
    truth = largest_that_fits(lambda n: _runs(n, keeps_pred), fit.max_batch)
    # Before the default kept the output, the quickstart's loop ran out of
    # memory at the answer: 73 where it runs 58.
    assert fit.max_batch <= truth, (fit.max_batch, truth)
    assert fit.max_batch >= 0.9 * truth, (fit.max_batch, truth)
    said = [n for n in fit.notes if "keep_output=False" in n]
    if keeps_pred:  # the logits at the answer: batch x 16 tokens x 500 classes, float32
        assert len(said) == 1 and f"{fit.max_batch}" in said[0], fit.notes
        assert memfit.format_bytes(fit.max_batch * LENGTH * VOCAB * 4) in said[0]
    else:
        assert any("output dropped once the loss exists" in n for n in fit.notes), fit.notes


def test_a_classifiers_few_outputs_say_nothing():
    # 10 outputs a sample beside 2048 activations: 0.5% of the step's bytes.
    gc.collect()
    with memfit.simulated_device((8 << 20) + tracked_live_bytes("cpu")):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 2048), torch.nn.ReLU(),
                                    torch.nn.Linear(2048, 10))
        fit = memfit.find_batch_size(model, torch.randn(8, 64), torch.randint(0, 10, (8,)),
                                     loss_fn=F.cross_entropy, optimizer="adam")
    assert not any("keep_output" in n for n in fit.notes), fit.notes


def test_keep_output_must_be_a_bool():
    model = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match=r"^\[find_batch_size\] keep_output must be True or "
                                         r"False, got 'no'$"):
        memfit.find_batch_size(model, torch.randn(4, 4), torch.randn(4, 2), budget="1MiB",
                               keep_output="no")


def test_profile_counts_the_kept_logits_at_the_peak_to_the_byte_and_says_so():
    torch.manual_seed(0)
    x = torch.randint(0, VOCAB, (32, LENGTH))
    kept = memfit.profile(TiedLM(), x, x.clone(), loss_fn=_loss, optimizer="adam")
    dropped = memfit.profile(TiedLM(), x, x.clone(), loss_fn=_loss, optimizer="adam",
                             keep_output=False)
    logits = 32 * LENGTH * VOCAB * 4  # float32
    # The peak is in the loss's backward either way; the kept logits sit beside it.
    assert kept.peak_bytes - dropped.peak_bytes == logits
    said = [n for n in kept.notes if "keep_output=False" in n]
    assert len(said) == 1 and memfit.format_bytes(logits) in said[0], kept.notes
    assert not any("stays alive until the next forward" in n for n in dropped.notes)
