"""mode='meta' for a CPU target: one CPU step checks the first meta
recording, and where the CPU's own kernels take more (linear algebra's
scratch, the CPU's autocast) the step is rehearsed on the CPU. The truth is
plain training steps on a simulated device of the budget. See Note [Meta
mode checked against the CPU's kernels]."""

import torch
import torch.nn.functional as F
from torch.nn.utils.parametrizations import orthogonal

import memfit
from memfit.testing.truth import plain_steps_run

D = 128


class Rotated(torch.nn.Module):
    """An orthogonal weight (matrix_exp of a 128 x 128 matrix, whose CPU
    kernel and backward keep several such matrices meta does not size)."""

    def __init__(self):
        super().__init__()
        self.rotate = orthogonal(torch.nn.Linear(D, D))
        self.head = torch.nn.Linear(D, 10)

    def forward(self, x):
        return self.head(torch.relu(self.rotate(x)))


def build():
    torch.manual_seed(0)
    model = Rotated()
    return model, torch.optim.Adam(model.parameters())


def data(n):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, D, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_a_step_whose_cpu_kernels_take_more_than_meta_is_fitted_on_the_cpu():
    # Meta recorded 0.96 MiB at batch 8, the CPU's step 3.90 MiB: meta's
    # answer at 4 MiB ran out in plain steps.
    budget = 4 << 20
    model, opt = build()
    x, y = data(8)
    fit = memfit.find_batch_size(model, x, y, loss_fn=F.cross_entropy, optimizer=opt,
                                 budget=budget, mode="meta")
    assert any(n.startswith("mode='meta' rehearsed this step on the CPU: at batch 8")
               for n in fit.notes), fit.notes

    def step(m, o):
        xs, ys = data(fit.max_batch)
        F.cross_entropy(m(xs), ys).backward()
        o.step()
        o.zero_grad()

    assert plain_steps_run(budget, build, step), fit
    cpu = memfit.find_batch_size(model, x, y, loss_fn=F.cross_entropy, optimizer=opt,
                                 budget=budget, mode="cpu")
    assert fit.max_batch == cpu.max_batch


def test_a_step_meta_sizes_stays_on_meta_and_says_it_was_checked():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(D, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    x, y = data(8)
    r = memfit.profile(model, x, y, loss_fn=F.cross_entropy, optimizer="adam", mode="meta")
    assert r.mode == "meta"
    assert any(n.startswith("meta's figures checked against one CPU step at batch 8")
               for n in r.notes), r.notes
