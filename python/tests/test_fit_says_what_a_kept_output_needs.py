"""find_batch_size fits a loop that drops the model's output once the loss
exists (`loss_fn(model(x), y).backward()`, Note [The order of a training
iteration]). PyTorch's quickstart keeps it (`pred = model(X)`) through
backward: for a language model the logits are the largest tensor, and that
loop runs out of memory at the answer. Where the output is 1% of the budget
or more at the peak, the answer says how much more that loop holds and the
margin that keeps it free. Truth: plain steps on the simulated device."""

import gc
import re

import torch
import torch.nn.functional as F

import memfit
from memfit._native import tracked_live_bytes
from memfit.testing.truth import largest_that_fits, plain_steps_run

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
    def build():
        model = TiedLM()
        return model, torch.optim.Adam(model.parameters())

    def step(model, opt):
        x, y = torch.randint(0, VOCAB, (n, LENGTH)), torch.randint(0, VOCAB, (n, LENGTH))
        if keeps_pred:  # the quickstart's loop
            pred = model(x)
            loss = _loss(pred, y)
            loss.backward()
        else:
            _loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return plain_steps_run(BUDGET, build, step, steps=3)


def _fit(margin=0):
    gc.collect()
    torch.manual_seed(0)
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        model = TiedLM()
        opt = torch.optim.Adam(model.parameters())
        x, y = torch.randint(0, VOCAB, (8, LENGTH)), torch.randint(0, VOCAB, (8, LENGTH))
        return memfit.find_batch_size(model, x, y, loss_fn=_loss, optimizer=opt, margin=margin)


def test_the_answer_says_the_bytes_a_loop_keeping_the_logits_needs_and_the_margin_runs_it():
    fit = _fit()
    said = [n for n in fit.notes if "keeps it through backward" in n]
    assert len(said) == 1, fit.notes
    # The logits at the answer: batch x 16 tokens x 500 classes, float32.
    extra = fit.max_batch * LENGTH * VOCAB * 4
    assert f"pass margin={extra} to keep it free" in said[0]
    assert _runs(fit.max_batch, keeps_pred=False)  # the loop fitted runs
    assert not _runs(fit.max_batch, keeps_pred=True)  # the quickstart's runs out: said
    kept = _fit(margin=int(re.search(r"margin=(\d+)", said[0]).group(1)))
    truth = largest_that_fits(lambda n: _runs(n, keeps_pred=True), kept.max_batch)
    # The margin is the logits at the first answer, more than at the
    # quickstart's own largest batch: safe, and 52 of its 58 here.
    assert kept.max_batch <= truth and kept.max_batch >= 0.85 * truth, (kept.max_batch, truth)


def test_a_classifiers_few_outputs_say_nothing():
    # 10 outputs a sample beside 2048 activations: 0.5% of the step's bytes.
    gc.collect()
    with memfit.simulated_device((8 << 20) + tracked_live_bytes("cpu")):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 2048), torch.nn.ReLU(),
                                    torch.nn.Linear(2048, 10))
        fit = memfit.find_batch_size(model, torch.randn(8, 64), torch.randint(0, 10, (8,)),
                                     loss_fn=F.cross_entropy, optimizer="adam")
    assert not any("keeps it through backward" in n for n in fit.notes), fit.notes
