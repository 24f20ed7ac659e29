"""What the loop moves to the host (`outs.append(out.detach().cpu())`, the
doctor's own fix for a list of outputs) is host memory in the GPU run the
CPU rehearses, where `.cpu()` returns the same storage: no memory_growth.
What the loop keeps on the device (`outs.append(out.detach())`) is growth
at the line that keeps it, the tensor without a graph. The truth is the
device's live bytes after plain steps of the loop, with the host copy made
outside the tracked allocator (numpy's) as a GPU run's `.cpu()` makes it
outside the device."""

import gc
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import memfit
from memfit._native import tracked_live_bytes

THIS = os.path.realpath(__file__)
STEPS = 6


def mlp(hidden=64):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(64, 32, generator=g), torch.randint(0, 10, (64,), generator=g))
            for _ in range(STEPS)]


def train(model, opt, keep, after_step=lambda: None):
    outs, preds = [], []
    for x, y in batches():
        opt.zero_grad()
        out = model(x)
        F.cross_entropy(out, y).backward()
        opt.step()
        keep(outs, preds, out)  # <- keep
        after_step()


def kept_on_device(outs, preds, out):
    outs.append(out.detach())  # <- outs
    preds.append(out.argmax(1))  # <- preds


def kept_on_host(outs, preds, out):
    outs.append(out.detach().cpu())
    preds.append(out.argmax(1).to("cpu").numpy())


def kept_outside_the_device(outs, preds, out):
    outs.append(out.detach().numpy().copy())
    preds.append(out.argmax(1).numpy().copy())


def growth(keep):
    """Bytes the device's live memory grows by per step, plain steps."""
    gc.collect()
    live = []
    with memfit.simulated_device(1 << 40):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        train(model, opt, keep, lambda: live.append(tracked_live_bytes("cpu")))
    per = {b - a for a, b in zip(live[1:], live[2:])}
    assert len(per) == 1, live
    return per.pop()


def doctor(keep):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with memfit.doctor(model, opt) as d:
        train(model, opt, keep)
    return [f for f in d.findings if f.kind in ("memory_growth", "tensors_kept")], d


def line_of(tag):
    with open(THIS) as f:
        return next(i + 1 for i, t in enumerate(f) if t.rstrip().endswith(f"# <- {tag}"))


def test_outputs_kept_on_the_device_grow_by_what_they_keep():
    truth = growth(kept_on_device)
    assert truth == 64 * 10 * 4 + 64 * 8
    found, d = doctor(kept_on_device)
    assert sum(f.bytes for f in found) == truth, d.report()
    # The detached outputs were "autograd graphs of the forward ... stay
    # alive", at the forward's line, with "run it under torch.no_grad()".
    by_line = {f.where.line: f for f in found}
    assert set(by_line) == {line_of("outs"), line_of("preds")}, d.report()
    outs = by_line[line_of("outs")]
    assert outs.bytes == 64 * 10 * 4 and "no_grad" not in outs.fix, d.report()
    assert "autograd graph" not in outs.seen, d.report()


def test_outputs_moved_to_the_host_are_no_growth():
    assert growth(kept_outside_the_device) == 0
    found, d = doctor(kept_on_host)
    assert found == [], d.report()  # it said +3.00 KiB per step: run it under no_grad


def train_keeping_at_a_key(model, opt, after_step=lambda: None):
    history = {}
    for i, (x, y) in enumerate(batches()):
        opt.zero_grad()
        out = model(x)
        F.cross_entropy(out, y).backward()
        opt.step()
        history[i] = out  # <- at a key
        after_step()


def train_keeping_in_a_tuple(model, opt, after_step=lambda: None):
    pairs = []
    for x, y in batches():
        opt.zero_grad()
        out = model(x)
        F.cross_entropy(out, y).backward()
        opt.step()
        pairs.append((out, y))  # <- in a tuple
        after_step()


@pytest.mark.parametrize("train_loop, tag", [(train_keeping_at_a_key, "at a key"),
                                             (train_keeping_in_a_tuple, "in a tuple")])
def test_outputs_kept_at_a_key_or_in_a_tuple_are_growth_at_that_line(train_loop, tag):
    gc.collect()
    live = []
    with memfit.simulated_device(1 << 40):
        model = mlp()
        train_loop(model, torch.optim.SGD(model.parameters(), lr=0.1),
                   lambda: live.append(tracked_live_bytes("cpu")))
    (truth,) = {b - a for a, b in zip(live[1:], live[2:])}
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with memfit.doctor(model, opt) as d:
        train_loop(model, opt)
    (f,) = [f for f in d.findings if f.kind == "memory_growth"]
    # It was the forward's line, "run it under torch.no_grad()" (a training loop).
    assert f.where.line == line_of(tag) and f.bytes == truth, d.report()
    assert "no_grad" not in f.fix and ".detach().cpu()" in f.fix, d.report()
