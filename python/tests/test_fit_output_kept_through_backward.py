"""The tutorial's loop keeps the model's output alive through backward
(`pred = model(X); loss = loss_fn(pred, y); loss.backward()`): a language
model's logits, its largest tensor. find_batch_size's answer must run that
loop. The truth is not memfit's: plain steps under memfit.simulated_device
at the budget, the model and optimizer built inside it."""

import gc

import torch
import torch.nn.functional as F

import memfit
from memfit._native import tracked_live_bytes
from memfit.testing.truth import plain_steps_run

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


def _batch(n):
    return torch.randint(0, VOCAB, (n, LENGTH)), torch.randint(0, VOCAB, (n, LENGTH))


def _loss(pred, y):
    return F.cross_entropy(pred, y.flatten())


def _tutorial_step(model, opt, n):
    x, y = _batch(n)
    pred = model(x)
    loss = _loss(pred, y)
    loss.backward()
    opt.step()
    opt.zero_grad()


def _build(n):
    def build():
        model = TiedLM()
        return model, torch.optim.Adam(model.parameters()), n
    return build


def test_the_answer_runs_a_loop_that_keeps_the_logits_through_backward():
    gc.collect()
    torch.manual_seed(0)
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        model = TiedLM()
        opt = torch.optim.Adam(model.parameters())
        x, y = _batch(8)
        fit = memfit.find_batch_size(model, x, y, loss_fn=_loss, optimizer=opt)
        del model, opt, x, y
    assert fit.verified
    # It answered 73 where this loop ran 58 when the step dropped the logits.
    assert plain_steps_run(BUDGET, _build(fit.max_batch), _tutorial_step, steps=3), \
        f"batch {fit.max_batch} ran out of memory"
    assert not plain_steps_run(BUDGET, _build(int(fit.max_batch * 1.1) + 1), _tutorial_step,
                               steps=3), "not tight"
