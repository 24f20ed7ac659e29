"""grads_kept says what freeing the gradients earlier takes off the step's
peak, as plain steps on the simulated device measure it (the smallest
budget each loop runs in, with and without the mistake), and says nothing
where the peak lies in backward, which makes the gradients anyway: there a
late zero_grad() or set_to_none=False costs nothing."""

import gc
import os

import torch
import torch.nn.functional as F
from torch import nn

import memfit
from memfit._native import tracked_live_bytes
from memfit.testing.truth import smallest_budget

THIS = os.path.realpath(__file__)
STEPS = 4


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def batches(batch):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 64, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(STEPS)]


def loop(model, opt, data, late, set_to_none):
    for x, y in data:
        if not late:
            opt.zero_grad(set_to_none=set_to_none)  # <- zero_grad
        loss = F.cross_entropy(model(x), y)
        if late:
            opt.zero_grad(set_to_none=set_to_none)  # <- late zero_grad
        loss.backward()
        opt.step()


def _runs(budget, optimizer, batch, late, set_to_none):
    gc.collect()
    left = tracked_live_bytes("cpu")
    try:
        with memfit.simulated_device(budget + left):
            model = mlp()
            loop(model, optimizer(model.parameters(), lr=0.1), batches(batch), late, set_to_none)
        return True
    except torch.cuda.OutOfMemoryError:
        return False


def true_peak(*args):
    """The smallest budget (to 128 bytes) plain steps of the loop run in."""
    return smallest_budget(lambda budget: _runs(budget, *args), 256 << 10, 8 << 20, 128)


def runs_within(saving, *args):
    """Plain steps of the loop need `saving` bytes more than the fixed
    loop's (its args: set_to_none=True, zero_grad before the forward)."""
    optimizer, batch = args[:2]
    fixed = true_peak(optimizer, batch, False, True)
    return _runs(fixed + saving + 128, *args) and not _runs(fixed + saving - 128, *args)


def doctor(optimizer, batch, late, set_to_none):
    model = mlp()
    opt = optimizer(model.parameters(), lr=0.1)
    with memfit.doctor(model, opt) as d:
        loop(model, opt, batches(batch), late, set_to_none)
    return [f for f in d.findings if f.kind == "grads_kept"], d


def line_of(tag):
    with open(THIS) as f:
        return next(i + 1 for i, t in enumerate(f) if t.rstrip().endswith(f"# <- {tag}"))


def test_late_zero_grad_claims_what_moving_it_saves():
    found, d = doctor(torch.optim.SGD, 32, True, True)
    assert len(found) == 1, d.report()
    f = found[0]
    assert f.where.line == line_of("late zero_grad") and os.path.realpath(f.where.file) == THIS
    # It said all the gradients' bytes (340008) where moving it saves 64 KiB.
    assert runs_within(f.estimated_saving, torch.optim.SGD, 32, True, True), f
    assert abs(f.measured_saving - f.estimated_saving) <= 128, f


def test_late_zero_grad_where_backward_holds_the_peak_is_no_finding():
    assert runs_within(0, torch.optim.SGD, 512, True, True)
    found, d = doctor(torch.optim.SGD, 512, True, True)
    assert found == [], d.report()


def test_set_to_none_false_claims_what_freeing_saves():
    found, d = doctor(torch.optim.SGD, 32, False, False)
    assert len(found) == 1, d.report()
    assert found[0].where.line == line_of("zero_grad")
    assert runs_within(found[0].estimated_saving, torch.optim.SGD, 32, False, False), found


def test_set_to_none_false_where_adam_holds_the_peak_is_no_finding():
    # Adam's step holds the peak, where the gradients are alive anyway.
    assert runs_within(0, torch.optim.Adam, 8, False, False)
    found, d = doctor(torch.optim.Adam, 8, False, False)
    assert found == [], d.report()
