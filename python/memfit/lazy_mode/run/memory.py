"""Memory: what is available on a device, what a step of c samples needs
(measured on small runs, fitted as a + b*c), and the largest c that fits.
"""

import math

import torch

from ..._native import allocation_id, budget, format_bytes, tracked_live_bytes
from ..graph.placement import on_host

__all__: list = []


def device_available(device):
    if device is None:
        return None
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type in ("cpu", "meta"):
        b = budget(device.type)
        if b is None:
            return None
        return b - tracked_live_bytes(device.type)
    return None


def profile_memory(device, fn):
    """Run fn() and describe its memory.

    CPU: the live bytes after each tracked allocation, twice: as measured
    ("first": gradients fn() returns are kept, as .grad is on a first
    backward) and with those gradient buffers freed as soon as made
    ("later": a backward accumulating into existing .grad), with the
    allocating ops to align two runs. CUDA: the peak above what was
    allocated before (both curves the same)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        return None, [peak], [peak]
    from ...memory.tracking import track

    with track() as t:
        kept = fn()
        persistent = {allocation_id(g) for g in (kept or ()) if g is not None}
        kept = None
    events = t.timeline.events()
    del t
    return live_curves(events, device.type, persistent)


def live_curves(events, device_type, persistent=()):
    """(ops, first, later) of a recorded timeline's allocations on
    `device_type`: see profile_memory; `persistent`: the ids of the
    gradient buffers the run returned."""
    live = held = 0
    alive = {}
    ops, first, later = [], [], []
    for kind, nbytes, ident, dev, _cat, _phase, _module, op in events:
        if dev != device_type:
            continue
        if kind == "alloc":
            alive[ident] = nbytes
            live += nbytes
            ops.append(op)
            first.append(live)
            later.append(live - held)
            if ident in persistent:
                held += nbytes
        elif ident in alive:
            n = alive.pop(ident)
            live -= n
            if ident in persistent:
                held -= n
    return ops, first or [0], later or [0]


def allocation_lines(prof1, prof2, p1, p2, which):
    """The live bytes at each allocation as a + b*c, from two runs that
    allocate in the same order (None when they do not)."""
    ops1, c1 = prof1[0], prof1[which]
    ops2, c2 = prof2[0], prof2[which]
    if ops1 is None or ops1 != ops2:
        return None
    lines = []
    for a1, a2 in zip(c1, c2):
        b = (a2 - a1) / (p2 - p1)
        lines.append((a1 - b * p1, b))
    return lines


def collapsed(lines):
    """The lines that can bound the most live bytes: for each slope, the
    largest intercept."""
    best = {}
    for a, b in lines:
        key = round(b, 6)
        if best.get(key, -math.inf) < a:
            best[key] = a
    return [(a, b) for b, a in best.items()]


def fit_lines(prof1, prof2, p1, p2, which):
    """Memory as a function of the chunk size c: the most live bytes over
    the step's allocations, each fitted as a + b*c from two runs. When the
    two runs allocate in the same order (the usual case) this is exact for
    every allocation whose size is affine in c, and the peak's location may
    move with c (at 2 samples the peak is the gradients, at 200 the
    activations). Otherwise: a conservative fit of the peaks."""
    per_allocation = allocation_lines(prof1, prof2, p1, p2, which)
    if per_allocation is not None:
        return collapsed(per_allocation), True
    ops1, c1, c2 = prof1[0], prof1[which], prof2[which]
    peak1, peak2 = max(c1), max(c2)
    m = max((peak2 - peak1) / (p2 - p1), 1.0)
    M0 = max(peak1 - m * p1, 0.0)
    lines = [(M0, m)]
    if ops1 is not None:  # misaligned CPU runs: also bound by peak per sample
        lines.append((0.0, peak2 / p2))
    return lines, False


def solve_lines(lines, usable, extra_per_sample):
    """Largest c with a + (b + extra)*c <= usable for every line; and the
    (a, b) line that limits it."""
    c_best, limiting = math.inf, None
    for a, b in lines:
        b = b + extra_per_sample
        if b <= 0:
            if a > usable:
                return 0, (a, b)
            continue
        c = math.floor((usable - a) / b)
        if c < c_best:
            c_best, limiting = c, (a, b)
    if limiting is None:
        limiting = max(lines, key=lambda ab: ab[0])
    return c_best, limiting


def _itemsize(dtype):
    """Bytes per element, without allocating (a tracked allocation could be
    refused)."""
    size = getattr(dtype, "itemsize", None)  # torch >= 2.1
    if size:
        return size
    try:
        if dtype.is_complex:
            return 2 * torch.finfo(dtype).bits // 8
        if dtype.is_floating_point:
            return torch.finfo(dtype).bits // 8
        if dtype == torch.bool:
            return 1
        return torch.iinfo(dtype).bits // 8
    except TypeError:
        return 1


def node_nbytes(n):
    total = _itemsize(n.dtype)
    for s in n.shape:
        total *= s if s is not None else 0
    return total


def new_grad_bytes(cands):
    """Bytes of the .grad tensors the first backward will create and keep:
    later chunks run with them allocated."""
    return sum(p.numel() * p.element_size() for p in cands
               if p.requires_grad and p.grad is None)


def _capacity(device):
    """The device's size: the simulated budget, or a CUDA device's memory."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type in ("cpu", "meta"):
        return budget(device.type)
    return None


def batch_note(data, info):
    """What the batch's own data has to do with an OOM, in one sentence (or
    ""): a batch on the device that leaves too little for the step, or a
    batch on the host, which is not the cause."""
    fmt = format_bytes
    resident = sum(t.numel() * t.element_size() for t in data.resident
                   if not on_host(t, t.device))
    if resident:
        device = data.resident[0].device
        capacity = _capacity(device)
        avail = info.available_bytes
        one = (info.fixed_bytes + info.bytes_per_sample
               if info.fixed_bytes is not None and info.bytes_per_sample is not None else None)
        if one is not None and avail is not None:
            cause = one <= avail + resident
        else:
            cause = capacity is not None and resident >= 0.1 * capacity
        if cause:
            of = f" of the device's {fmt(capacity)}" if capacity else ""
            return (
                f"The batch's own data is what does not fit: the lazy inputs hold "
                f"{fmt(resident)}{of} on the device before the step starts. Keep the batch "
                f"in host memory (CPU RAM; memfit.host_memory() on the simulated device) and "
                f"pass memfit.lazy(..., device=...): each micro-batch then moves to the "
                f"device as it runs."
            )
        return ""
    if data.host:
        per_sample = data.host_sample_bytes
        return (
            f"The batch itself is not the cause: it stays in host memory and one sample of "
            f"it takes {fmt(per_sample)} on the device; the step's own memory (parameters, "
            f"gradients, activations) does not fit."
        )
    return ""
