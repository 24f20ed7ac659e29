"""A forward hook that stores its module's output at every step is
memory_growth at the hook's line with the bytes it keeps, not "the
autograd graphs of the forward stay alive" at the forward's line with
"run it under torch.no_grad()" (a training loop needs its graph). Its fix,
a host copy, gets no finding. The truth is the device's live bytes after
plain steps, the host copy made outside the tracked allocator (numpy's)
as a GPU run's `.cpu()` makes it outside the device."""

import gc
import os

import torch
import torch.nn.functional as F

import memfit
from memfit._native import tracked_live_bytes

from test_doctor_host_copies import batches, mlp

THIS = os.path.realpath(__file__)


def on_device(acts):
    def save(module, inputs, output):
        acts.append(output)  # <- hook
    return save


def on_host(acts):
    return lambda module, inputs, output: acts.append(output.detach().cpu())


def outside_the_device(acts):
    return lambda module, inputs, output: acts.append(output.detach().numpy().copy())


def train(hook, after_step=lambda: None, doctor=False):
    model = mlp(hidden=128)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with memfit.doctor(model, opt) if doctor else memfit.simulated_device(1 << 40) as d:
        acts = []
        model[1].register_forward_hook(hook(acts))
        for x, y in batches():
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            after_step()
    return d


def growth(hook):
    """Bytes the device's live memory grows by per step, plain steps."""
    gc.collect()
    live = []
    train(hook, lambda: live.append(tracked_live_bytes("cpu")))
    per = {b - a for a, b in zip(live[1:], live[2:])}
    assert len(per) == 1, live
    return per.pop()


def growth_found(hook):
    d = train(hook, doctor=True)
    return [f for f in d.findings if f.kind in ("memory_growth", "tensors_kept")], d


def test_a_hook_that_stores_activations_is_growth_at_its_line():
    truth = growth(on_device)
    assert truth == 64 * 128 * 4
    found, d = growth_found(on_device)
    assert len(found) == 1, d.report()
    f = found[0]
    with open(THIS) as src:
        line = next(i + 1 for i, t in enumerate(src) if t.rstrip().endswith("# <- hook"))
    assert os.path.realpath(f.where.file) == THIS and f.where.line == line, d.report()
    assert f.bytes == truth and f.estimated_saving == truth, d.report()
    assert "no_grad" not in f.fix and ".detach().cpu()" in f.fix, d.report()


def test_a_hook_that_stores_host_copies_gets_no_finding():
    assert growth(outside_the_device) == 0
    found, d = growth_found(on_host)
    assert found == [], d.report()


def test_a_hook_that_logs_numbers_leaves_a_kept_output_to_the_line_that_keeps_it():
    model = mlp(hidden=128)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with memfit.doctor(model, opt) as d:
        means, outs = [], []
        model.register_forward_hook(lambda m, i, output: means.append(output.mean().item()))
        for x, y in batches():
            opt.zero_grad()
            out = model(x)
            F.cross_entropy(out, y).backward()
            opt.step()
            outs.append(out)  # <- outs
    found = [f for f in d.findings if f.kind == "memory_growth"]
    with open(THIS) as src:
        line = next(i + 1 for i, t in enumerate(src) if t.rstrip().endswith("# <- outs"))
    assert [f.where.line for f in found] == [line], d.report()
    assert found[0].bytes == 64 * 10 * 4, d.report()  # the output, as plain steps keep it
