"""Memory a step leaves on the device for good (a library's workspace, a
cache a module keeps outside its weights), made the first time a step runs:
find_batch_size must hold it against the budget at every batch, and must
not read its one-time arrival as memory that grows with the batch.

What the H200 showed (docs/benchmarks.md, "memfit on the card"): cuBLAS
takes a 32 MiB workspace per thread at the first matrix product of a size
and keeps it. The example batch's step made them, so the example's peak
held 68 MB the probes after it did not: the search read 17 MB a sample
and answered the MLP 8 where plain steps ran 12705. The simulated device
here keeps such a workspace the way cuBLAS does."""

import gc

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memfit
from memfit._native import tracked_live_bytes
from memfit.testing.truth import largest_that_fits, plain_steps_run

BUDGET = 16 << 20
WORKSPACE = 4 << 20  # a quarter of the budget: missing it would overshoot by ~400 samples

# The library's own cache: made at the first product of 4 rows or more (as
# cuBLAS picks another kernel past a size), then kept, outside every module.
_workspaces = {}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(256, 1024), nn.Linear(1024, 10)

    def forward(self, x):
        if x.shape[0] >= 4 and "w" not in _workspaces:
            _workspaces["w"] = torch.empty(WORKSPACE, dtype=torch.uint8)
        return self.b(F.relu(self.a(x)))


def _batch(n):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 256, generator=g), torch.randint(0, 10, (n,), generator=g)


def _plain_step(model, opt, x, y):
    F.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _true_max(start):
    """The largest batch whose plain Adam steps run on a device of BUDGET."""
    def build():
        _workspaces.clear()  # each truth starts as a fresh process would
        torch.manual_seed(1)
        m = Net()
        return m, torch.optim.Adam(m.parameters())

    def fits(n):
        xs, ys = _batch(n)
        try:
            return plain_steps_run(BUDGET, build,
                                   lambda m, o: _plain_step(m, o, xs.clone(), ys.clone()))
        finally:
            _workspaces.clear()

    return largest_that_fits(fits, start)


# Example 8: the example's own step makes the workspace (the room is taken
# again after it). Example 2: a probe makes it (the search runs again).
@pytest.mark.parametrize("example", [8, 2])
def test_a_workspace_a_step_keeps_is_held_against_the_budget_and_is_not_growth(example):
    gc.collect()
    x, y = _batch(example)
    _workspaces.clear()
    left = tracked_live_bytes("cpu")  # what earlier tests left on the device
    with memfit.simulated_device(BUDGET + left):
        torch.manual_seed(1)
        model = Net()
        opt = torch.optim.Adam(model.parameters())
        fit = memfit.find_batch_size(model, x, y, optimizer=opt)
        kept = "w" in _workspaces
        del model, opt
        _workspaces.clear()
    assert kept and fit.mode == "device" and fit.verified
    true_max = _true_max(fit.max_batch)
    assert fit.max_batch <= true_max, (fit.max_batch, true_max)  # never above
    # Close to it: 683 of 695 measured (before: 15, the workspace read as
    # growth); 0.95 leaves room for the search's own stop short of the truth.
    assert fit.max_batch >= 0.95 * true_max, (fit.max_batch, true_max)


@pytest.mark.parametrize("example", [8, 2])
def test_the_callbacks_plan_holds_the_workspace_too(example):
    # Lightning's and Hugging Face's callbacks size the batch through
    # plan_batch (memfit.integrations.api): the same room after one step,
    # and after the search where a probe made the workspace.
    from memfit.integrations import api

    gc.collect()
    _workspaces.clear()
    how = api.UserStep(step=lambda m, b: F.cross_entropy(m(b[0]), b[1]), what="Callback")
    left = tracked_live_bytes("cpu")
    with memfit.simulated_device(BUDGET + left):
        torch.manual_seed(1)
        model = Net()
        opt = torch.optim.Adam(model.parameters())
        batch = api.plan_batch(model, _batch(example), opt, whole=api.LoopStep(how), budget=None,
                               what="Callback").batch_size
        del model, opt
        _workspaces.clear()
    true_max = _true_max(batch)
    assert 0.95 * true_max <= batch <= true_max, (batch, true_max)


def test_the_trainers_micro_batch_holds_the_workspace_and_is_not_cut_by_it():
    # memfit.Trainer plans the micro-batch of a batch the device cannot run
    # whole; the truth is plain steps of that micro-batch, twice, the
    # gradients added up, then Adam's step (the split step it runs).
    gc.collect()
    _workspaces.clear()
    x, y = _batch(4096)
    left = tracked_live_bytes("cpu")
    with memfit.simulated_device(BUDGET + left):
        torch.manual_seed(1)
        model = Net()
        trainer = memfit.Trainer(model, torch.optim.Adam(model.parameters()), F.cross_entropy)
        report = trainer.step(x, y)
        micro = trainer.planned.micro_batch
        del model, trainer
        _workspaces.clear()
    assert report.ooms_recovered == 0 and 0 < micro < 4096

    def build():
        _workspaces.clear()
        torch.manual_seed(1)
        m = Net()
        return m, torch.optim.Adam(m.parameters())

    def split_step(m, opt, xs, ys):  # each micro-batch moved to the device in turn
        for part in (slice(0, len(xs) // 2), slice(len(xs) // 2, None)):
            F.cross_entropy(m(xs[part].clone()), ys[part].clone()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def fits(n):
        xs, ys = _batch(2 * n)
        try:
            return plain_steps_run(BUDGET, build, lambda m, o: split_step(m, o, xs, ys))
        finally:
            _workspaces.clear()

    true_max = largest_that_fits(fits, micro)
    # The Trainer plans an even split of 4096 at most its fit: within 10%.
    assert 0.9 * true_max <= micro <= true_max, (micro, true_max)


class Features(nn.Module):
    """Feature extraction as users write it: a forward hook on each layer
    keeps its latest output, replaced at the next forward."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                 nn.Linear(512, 10))
        self.features = {}
        for name, layer in self.net.named_children():
            layer.register_forward_hook(self._keep(name))

    def _keep(self, name):
        def hook(module, args, output):
            self.features[name] = output
        return hook

    def forward(self, x):
        return self.net(x)


def test_what_a_step_replaces_at_the_next_step_is_not_taken_for_good():
    # After the search the hooks held the last probe's activations: read as
    # kept for good (a workspace), the search ran again without them and
    # answered 561 where plain steps run 1563.
    gc.collect()
    x, y = _batch(4)
    left = tracked_live_bytes("cpu")
    with memfit.simulated_device(BUDGET + left):
        torch.manual_seed(1)
        model = Features()
        fit = memfit.find_batch_size(model, x, y, optimizer=torch.optim.Adam(model.parameters()))
        del model

    def build():
        torch.manual_seed(1)
        m = Features()
        return m, torch.optim.Adam(m.parameters())

    def fits(n):
        xs, ys = _batch(n)
        return plain_steps_run(BUDGET, build, lambda m, o: _plain_step(m, o, xs.clone(),
                                                                          ys.clone()), steps=3)

    true_max = largest_that_fits(fits, fit.max_batch)
    assert fit.max_batch <= true_max, (fit.max_batch, true_max)
    assert fit.max_batch >= 0.95 * true_max, (fit.max_batch, true_max)
