"""A target batched along another dimension than the inputs (a seq-first
LSTM's (T, batch, F) input beside a (batch,) class target): batch_dim's
first dimension, which cuts the target too, is one the target does not
have. The error says so and names the way that works (the target inside
the batch, with a step); that way fits as the user's plain steps run."""

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import plain_steps_run

BUDGET = 4 << 20


class SeqFirst(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn, self.head = torch.nn.LSTM(16, 64), torch.nn.Linear(64, 10)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[-1])


def test_a_target_without_the_inputs_batch_dimension_is_refused_naming_the_way_that_works():
    model = SeqFirst()
    x, y = torch.randn(12, 8, 16), torch.randint(0, 10, (8,))
    with pytest.raises(ValueError, match=r"^\[profile\] the target is cut along batch_dim's "
                                         r"first dimension, 1, .*batch_dim=\(1, 0\)"):
        memfit.find_batch_size(model, x, y, optimizer="adam", budget=BUDGET, batch_dim=1)


def test_the_target_inside_the_batch_with_a_step_fits_as_plain_steps_run():
    torch.manual_seed(0)
    model = SeqFirst()
    x, y = torch.randn(12, 8, 16), torch.randint(0, 10, (8,))
    fit = memfit.find_batch_size(model, (x, y), None, optimizer=torch.optim.SGD(
        model.parameters(), lr=0.1), budget=BUDGET, batch_dim=(1, 0),
        step=lambda m, b: F.cross_entropy(m(b[0]), b[1]))

    def runs(b):
        def build():
            m = SeqFirst()
            return m, torch.optim.SGD(m.parameters(), lr=0.1), b

        def step(m, opt, n):
            F.cross_entropy(m(torch.randn(12, n, 16)), torch.randint(0, 10, (n,))).backward()
            opt.step()
            opt.zero_grad()

        return plain_steps_run(BUDGET, build, step, steps=3)

    assert runs(fit.max_batch)
    assert not runs(int(fit.max_batch * 1.05) + 1)
