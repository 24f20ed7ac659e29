"""eval_with_grad says what running the forward under no_grad takes off the
steps' peak, as plain steps on the simulated device measure it (the
smallest budget the loop runs in, with grad and under no_grad): a
validation loss taken with .item() keeps its graph only for its line, so
where training holds the peak no_grad saves nothing, and where it is the
peak it saves what the graph held beyond what no_grad's forward needs.
The re-run measures the same: the forward's peak where the output goes at
once, what each forward holds where every graph stays (`total += loss`)."""

import gc

import torch
import torch.nn.functional as F
from torch import nn

import memfit
from memfit._native import tracked_live_bytes
from memfit.testing.truth import smallest_budget

STEPS = 4


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def loop(val_batch, grad):
    """Builds everything, then runs the loop: plain steps and the doctor
    see the same tensors."""
    model = mlp()
    opt = torch.optim.Adam(model.parameters())
    g = torch.Generator().manual_seed(1)
    vx = torch.randn(val_batch, 64, generator=g)
    vy = torch.randint(0, 10, (val_batch,), generator=g)
    data = [(torch.randn(64, 64, generator=g), torch.randint(0, 10, (64,), generator=g))
            for _ in range(STEPS)]
    return model, opt, data, vx, vy, grad


def body(model, opt, data, vx, vy, grad):
    for x, y in data:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        with torch.set_grad_enabled(grad):
            F.cross_entropy(model(vx), vy).item()


def _runs(budget, val_batch, grad):
    gc.collect()
    left = tracked_live_bytes("cpu")
    try:
        with memfit.simulated_device(budget + left):
            body(*loop(val_batch, grad))
        return True
    except torch.cuda.OutOfMemoryError:
        return False


def peak_saving_holds(saving, val_batch):
    """Plain steps with grad need `saving` bytes more than under no_grad."""
    hi = smallest_budget(lambda budget: _runs(budget, val_batch, False), 256 << 10, 16 << 20,
                         128)
    return _runs(hi + saving + 128, val_batch, True) and not _runs(hi + saving - 128, val_batch,
                                                                 True)


def claimed(val_batch):
    state = loop(val_batch, True)
    with memfit.doctor(state[0], state[1]) as d:
        body(*state)
    found = [f for f in d.findings if f.kind == "eval_with_grad"]
    assert len(found) == 1, d.report()
    return found[0]


def test_a_small_validation_with_grad_saves_nothing_off_trainings_peak():
    f = claimed(64)
    # It said 128 KiB: what the graph held while the line ran.
    assert f.estimated_saving == 0, f
    assert peak_saving_holds(0, 64)


def test_a_large_validation_with_grad_saves_what_its_graph_held_at_the_peak():
    f = claimed(1024)
    # It said 2 MiB: every activation, where no_grad's forward needs 1 MiB of them too.
    assert f.estimated_saving > 0 and peak_saving_holds(f.estimated_saving, 1024), f


def evaluate(model, data, grad):
    with torch.set_grad_enabled(grad):
        correct = 0
        for x, y in data:
            correct += (model(x).argmax(1) == y).sum().item()


def _eval_runs(budget, grad):
    gc.collect()
    left = tracked_live_bytes("cpu")
    try:
        with memfit.simulated_device(budget + left):
            model, _opt, data, *_ = loop(0, grad)
            evaluate(model.eval(), data, grad)
        return True
    except torch.cuda.OutOfMemoryError:
        return False


def test_an_eval_loop_with_grad_measures_what_no_grad_takes_off_its_peak():
    def smallest(grad):
        return smallest_budget(lambda budget: _eval_runs(budget, grad), 64 << 10, 16 << 20, 128)

    truth = smallest(True) - smallest(False)
    model, _opt, data, *_ = loop(0, True)
    model.eval()
    with memfit.doctor(model) as d:
        evaluate(model, data, True)
    found = [f for f in d.findings if f.kind == "eval_with_grad"]
    assert len(found) == 1, d.report()
    f = found[0]
    # The re-run said 128 KiB, what the graph held once the forward returned,
    # where the peak lies in the forward and no_grad takes 64 KiB off it.
    assert abs(f.estimated_saving - truth) <= 256, (f, truth)
    assert abs(f.measured_saving - truth) <= 0.1 * truth, (f, truth)


def summed(model, data, after_step=lambda: None):
    total = 0
    for x, y in data:
        total += F.cross_entropy(model(x), y)
        after_step()
    return total.item()


def test_an_eval_loss_summed_as_a_tensor_measures_what_each_forward_piles_up():
    gc.collect()
    live = []
    with memfit.simulated_device(1 << 40):
        model, _opt, data, *_ = loop(0, True)
        summed(model.eval(), data, lambda: live.append(tracked_live_bytes("cpu")))
    (truth,) = {b - a for a, b in zip(live, live[1:])}  # each forward's graph, kept
    model, _opt, data, *_ = loop(0, True)
    model.eval()
    with memfit.doctor(model) as d:
        summed(model, data)
    (f,) = [f for f in d.findings if f.kind == "eval_with_grad"]
    # The re-run said 0 B: one forward's peak, where every graph stays.
    assert abs(f.measured_saving - truth) <= 0.1 * truth, (f, truth)
