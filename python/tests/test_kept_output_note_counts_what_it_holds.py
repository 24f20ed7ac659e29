"""The note on a kept output (keep_output=True, the default) says what the
output keeps alive into the next forward, not its own tensors' bytes: a
view of the logits keeps their whole storage, an output the loss did not
use keeps its graph. Truth: plain steps of both loops on the simulated
device, the smallest budget each runs in and what each holds between
iterations. See Note [What a kept output holds] (_step/record.py)."""

import gc
import re

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit._native import tracked_live_bytes
from memfit.testing.truth import loop_body, plain_steps_run, smallest_budget

D, H, C, VOCAB, LENGTH = 64, 256, 10, 500, 32


class LastToken(torch.nn.Module):
    """Logits for every position; the output is the last one's, a view."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 64)
        self.head = torch.nn.Linear(64, VOCAB)

    def forward(self, x):
        return self.head(torch.tanh(self.emb(x)))[:, -1]


class WithAux(torch.nn.Module):
    """(logits, aux): the loss reads the logits only, so backward never
    frees the aux projection's graph (its input)."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.p = (torch.nn.Linear(D, H), torch.nn.Linear(H, C),
                                  torch.nn.Linear(H, H))

    def forward(self, x):
        h = torch.relu(self.a(x))
        return self.b(h), self.p(h)


def _first(out, y):
    return F.cross_entropy(out[0], y)


CASES = {
    "view": (LastToken, F.cross_entropy,
             lambda n: (torch.randint(0, VOCAB, (n, LENGTH)), torch.randint(0, VOCAB, (n,))), 24),
    "aux graph": (WithAux, _first, lambda n: (torch.randn(n, D), torch.randint(0, C, (n,))), 600),
}


def _plain(cls, loss_fn, batch, keeps):
    """Three iterations of the loop as written; the live bytes after the last."""
    after = []

    def build():
        model = cls()
        return model, torch.optim.Adam(model.parameters()), {}

    def step(model, opt, loop):
        loop_body(model, opt, *batch, loss_fn, loop if keeps else None)
        after.append(tracked_live_bytes("cpu"))
    return (lambda budget: plain_steps_run(budget, build, step, steps=3)), after


STEP = 32 << 10  # the budgets' resolution


@pytest.mark.parametrize("case", list(CASES))
def test_the_note_says_what_stays_alive_and_bounds_what_dropping_saves(case):
    cls, loss_fn, batch_at, n = CASES[case]
    torch.manual_seed(0)
    batch = batch_at(n)
    gc.collect()
    report = memfit.profile(cls(), *batch, loss_fn=loss_fn, optimizer="adam")
    said = [s for s in report.notes if "keep_output=False" in s]
    assert len(said) == 1, report.notes
    size = re.search(r"model's output \(([\d.]+) (\w+) at", said[0])
    figure = memfit.parse_size(size[1] + size[2])  # format_bytes's "3.11 MiB"
    (keeps, held), (drops, dropped) = (_plain(cls, loss_fn, batch, k) for k in (1, 0))
    assert keeps(8 << 20) and drops(8 << 20)
    alive = held[-1] - dropped[-1]  # into the next forward: what the note says
    # What the loop holds between iterations is below its peak.
    least = smallest_budget(drops, dropped[-1], dropped[-1] + (4 << 20), STEP)
    # Before, the note counted the output's own tensors: the view's 47 KiB
    # where 1.5 MiB stayed alive; the aux output's 0.6 MiB of 1.2 MiB.
    assert abs(figure - alive) <= 0.01 * alive, (figure, alive)
    # Dropping the output saves up to the figure: the kept loop runs in that much more.
    assert keeps(least + figure + STEP) and "up to that much less" in said[0], (least, figure)
