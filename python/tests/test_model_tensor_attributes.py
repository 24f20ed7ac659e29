"""The tensors a model holds besides its parameters and buffers, and the
buffers its forward replaces: a tensor kept as a plain attribute is the
model's (its plain steps hold it on the device), and a rehearsal leaves
every buffer and tensor attribute as the very object it was. The truth is
not memfit's: plain steps under memfit.simulated_device at the budget."""

import gc

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import plain_steps_run

BUDGET = 8 << 20


class PlainTable(torch.nn.Module):
    """A 2 MiB tensor kept as a plain attribute, not a buffer."""

    def __init__(self):
        super().__init__()
        self.inner, self.head = torch.nn.Linear(256, 512), torch.nn.Linear(512, 10)
        self.table = torch.randn(1024, 512)

    def forward(self, x):
        return self.head(torch.relu(self.inner(x)) + self.table[:1] * 0)


class Replacing(torch.nn.Module):
    """A forward that puts new tensors in its buffers' and attribute's
    places, and makes a cache at its first call."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(64, 10)
        self.register_buffer("n", torch.zeros((), dtype=torch.long))
        self.register_buffer("ema", torch.zeros(64))
        self.plain = torch.zeros(64)
        self.cache = None

    def forward(self, x):
        if self.training:
            self.n = self.n + 1
            self.ema = 0.9 * self.ema + 0.1 * x.detach().mean(0)
            self.plain = self.plain + 1
        if self.cache is None:
            self.cache = torch.ones(64)
        return self.inner(x * self.cache)


def runs(b):
    def build():
        model = PlainTable()
        return model, torch.optim.Adam(model.parameters()), b

    def step(model, opt, n):
        F.cross_entropy(model(torch.randn(n, 256)), torch.randint(0, 10, (n,))).backward()
        opt.step()
        opt.zero_grad()

    return plain_steps_run(BUDGET, build, step, steps=3)


def test_a_tensor_kept_as_a_plain_attribute_is_counted_and_the_answer_runs():
    gc.collect()
    torch.manual_seed(0)
    model = PlainTable()
    x, y = torch.randn(8, 256), torch.randint(0, 10, (8,))
    fit = memfit.find_batch_size(model, x, y, optimizer=torch.optim.Adam(model.parameters()),
                                 budget=BUDGET)
    assert runs(fit.max_batch), f"batch {fit.max_batch} ran out of memory"
    more = int(fit.max_batch * 1.05) + 1
    assert not runs(more), f"batch {more} ran too: not tight"


@pytest.mark.parametrize("mode", ["cpu", "meta"])
def test_buffers_and_attributes_a_forward_replaces_are_left_as_they_were(mode):
    torch.manual_seed(0)
    model = Replacing()
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    before = (model.n, model.ema, model.plain)
    values = [t.clone() for t in before]
    memfit.find_batch_size(model, x, y, optimizer=opt, budget=4 << 20, mode=mode)
    memfit.profile(model, x, y, optimizer=opt, mode=mode)
    after = (model.n, model.ema, model.plain)
    assert all(a is b for a, b in zip(after, before))
    assert all(t.device.type == "cpu" and torch.equal(t, v) for t, v in zip(after, values))
    assert model.cache is None
    assert set(dict(model.named_buffers())) == {"n", "ema"}


def test_an_attribute_that_names_a_weights_memory_still_does_after_two_fits():
    """The old torch.nn.utils.spectral_norm keeps `weight` as weight_orig's
    memory under another name until a forward recomputes it: after memfit's
    rehearsals it is that memory still (no stale second copy, nothing of the
    rehearsal's graph), and a second fit answers as plain steps run."""
    def build():
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 10))
        torch.nn.utils.spectral_norm(model[2])
        return model

    torch.manual_seed(0)
    model = build()
    x, y = torch.randn(8, 256), torch.randint(0, 10, (8,))
    budget = 14 << 20
    fits = [memfit.find_batch_size(model, x, y, optimizer=torch.optim.Adam(model.parameters()),
                                   budget=budget).max_batch for _ in range(2)]
    layer = model[2]
    assert layer.weight.grad_fn is None
    assert layer.weight.data_ptr() == layer.weight_orig.data_ptr()

    def runs(b):
        def made():
            m = build()
            return m, torch.optim.Adam(m.parameters()), b

        def step(m, opt, n):
            F.cross_entropy(m(torch.randn(n, 256)), torch.randint(0, 10, (n,))).backward()
            opt.step()
            opt.zero_grad()

        return plain_steps_run(budget, made, step, steps=3)

    assert fits[0] == fits[1] and runs(fits[1])
    assert not runs(int(fits[1] * 1.05) + 1)
