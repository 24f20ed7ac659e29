"""eval_with_grad claims what running the forward under torch.no_grad()
frees, as the live bytes after plain steps of the loop with and without
no_grad measure it: an input made on the forward's own line
(`model(x * 2)`, `model(x.to(device))`) is kept by the graph with the
output, and is not where the first layer does not save it (frozen)."""

import gc

import torch
import torch.nn.functional as F
from torch import nn

import memfit
from memfit._native import tracked_live_bytes

STEPS = 5


def mlp(frozen_first=False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    model[0].requires_grad_(not frozen_first)
    return model


def batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g))
            for _ in range(STEPS)]


def loop(model, opt, data, grad):
    for x, y in data:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        with torch.set_grad_enabled(grad):
            check = model(x * 2)  # noqa: F841 kept until the next check, as a loop does
    return check


def held_by_grad(frozen_first):
    """Live bytes after the loop with the check forward under grad, less
    under no_grad: plain steps, no doctor."""
    live = []
    for grad in (True, False):
        gc.collect()
        with memfit.simulated_device(1 << 40):
            model = mlp(frozen_first)
            opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
            data = batches()
            base = tracked_live_bytes("cpu")
            out = loop(model, opt, data, grad)
            live.append(tracked_live_bytes("cpu") - base)
            del out
    return live[0] - live[1]


def claimed(frozen_first):
    model = mlp(frozen_first)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    with memfit.doctor(model, opt) as d:
        loop(model, opt, batches(), True)
    found = [f for f in d.findings if f.kind == "eval_with_grad"]
    assert len(found) == 1, d.report()
    return found[0]


def test_an_input_made_on_the_forwards_line_is_held_by_its_graph():
    truth = held_by_grad(False)
    f = claimed(False)
    # It said 64.00 KiB: the graph's activations without x * 2 (8 KiB).
    assert f.bytes == truth and f.estimated_saving == truth, (f, truth)


def test_an_input_the_first_layer_does_not_save_is_not_counted():
    truth = held_by_grad(True)
    f = claimed(True)
    assert f.bytes == truth, (f, truth)
