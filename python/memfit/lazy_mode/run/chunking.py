"""Chunk sizing: the largest chunk that should fit, from a memory fit measured
once per graph signature and cached.
"""

import collections
import difflib
import gc
import math

import torch

from ..graph.errors import OutOfMemoryError
from ..graph.node import Arange, BatchInt, Node, Sliced
from ..graph.probe import leaving_no_trace
from .memory import (allocation_lines, collapsed, device_available, fit_lines, live_curves,
                     profile_memory, solve_lines)

__all__: list = []


#: Fraction of the available memory left unused when sizing chunks.
MARGIN = 0.10
#: How far over the memory available the fit of the whole batch may be and
#: the whole batch still be tried, when no split fits (Note [Never worse
#: than eager]): an OOM costs one attempt, and the fit's bytes are not exact.
WHOLE_SLACK = 0.02
#: Probe sizes used to measure memory per sample.
_MEASURE_SIZES = (2, 3)
_CACHE_MAX = 64
_cache = collections.OrderedDict()


def _argsig(obj, index):
    t = type(obj)
    if t is Node:
        return ("N", index.get(obj, -1))
    if t is tuple or t is list:
        return tuple(_argsig(o, index) for o in obj)
    if t is dict:
        return tuple((k, _argsig(v, index)) for k, v in obj.items())
    if t is BatchInt:
        return ("B", obj.k)
    if t is Sliced:
        s = list(obj.tensor.shape)
        s[obj.dim] = -obj.k
        return ("S", tuple(s), obj.tensor.dtype, obj.tensor.device.type)
    if t is Arange:
        return ("A",)
    if isinstance(obj, torch.Tensor):
        return ("T", tuple(obj.shape), obj.dtype, obj.device.type, obj.requires_grad)
    if obj is None or t in (bool, int, str):
        return obj
    if t is float:
        return "f"
    if isinstance(obj, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(obj)
    if isinstance(obj, slice):
        return ("sl", _argsig(obj.start, index), _argsig(obj.stop, index),
                _argsig(obj.step, index))
    return t.__name__


def graph_signature(order, sources, mode, extra):
    index = {n: i for i, n in enumerate(order)}
    parts = [mode, extra]
    for n in order:
        if n in sources:
            v = n.value
            shape = list(v.shape) if isinstance(v, torch.Tensor) else None
            if shape is not None and n.state == "batched":
                d = n.leaf_dim if n.kind == "leaf" else n.single_bdim()[0]
                shape[d] = -1
            parts.append(("src", n.state, str(n.dtype), str(n.device),
                          tuple(shape) if shape else None, n.to_device is not None))
            continue
        if n.module is not None:
            key = (type(n.module), id(n.module),
                   tuple(id(p) for p in n.module.parameters()), n.module.training)
        else:
            key = n.fn
        parts.append((n.kind, key, _argsig(n.args, index), _argsig(n.kwargs, index),
                      n.path, n.grad if mode != "read" else None, n.autocast))
    return tuple(parts)


def _cache_get(sig):
    e = _cache.get(sig)
    if e is not None:
        _cache.move_to_end(sig)
    return e


def _cache_put(sig, entry):
    _cache[sig] = entry
    _cache.move_to_end(sig)
    while len(_cache) > _CACHE_MAX:
        _cache.popitem(last=False)


def learn_from_ooms(entry, info, limit, final):
    """After an OOM, plan smaller chunks for this computation next time."""
    if entry is not None and info.ooms and limit:
        entry["scale"] = min(entry["scale"], max(final, 1) / limit)


def plan_limit(info, B, device, sig, measure, extra_per_sample=0.0, reserve=0, modules=()):
    """Largest chunk that should fit (None: no limit known).

    measure(p) prepares a run of the step on p samples (its inputs copied,
    see measurement_overrides) and returns it: a function that runs it and
    returns the gradients it computed (see profile_memory). `modules`: those the
    run calls, whose buffers and RNG are put back afterwards. `reserve`:
    bytes of .grad the first chunk will create; the first chunk must fit as
    measured, later ones with the gradients already allocated. Returns
    (limit, cache entry or None)."""
    entry = _cache_get(sig) if sig is not None else None
    avail = device_available(device)
    info.available_bytes = avail
    if avail is None:
        return None, None
    if entry is None:
        if B <= _MEASURE_SIZES[-1]:
            return B, None
        entry = _measured_fit(device, measure, modules)
        if entry is None:
            # Even a few samples do not fit the way things are now: try one
            # sample at a time and let OOM recovery tell the rest.
            return 1, None
        if sig is not None:
            _cache_put(sig, entry)
        info.measured = True
        if _split_limit(entry, avail, reserve, extra_per_sample)[0] < B:
            avail = _available_after_collecting(device)  # See Note [Garbage and the plan].
            info.available_bytes = avail
    info.keep_fit(entry, reserve, extra_per_sample)
    c, (a, b) = plan(entry, B, avail, reserve, extra_per_sample)
    info.bytes_per_sample = int(b)
    info.fixed_bytes = int(a)
    return c, entry


# Note [Garbage and the plan]
# Garbage not yet collected (cycles a finished step left) still holds
# tracked bytes, so the memory available depends on when Python's GC last
# ran, and so would the plan. A full collection (garbage promoted to the
# oldest generation holds bytes too: an LSTM step's 4 B) walks every object
# of the process: it was the largest part of a first call's cost (60-90 ms
# beside a 10-30 ms step). It runs only where it could change the plan:
# garbage only lowers the memory available, and the chunk limit only grows
# with it, so a plan that runs the whole batch with the garbage counted is
# the plan without it. A measurement that ran out of memory is made again
# after collecting (its bytes are those of its own allocations: garbage
# never enters them). Cached plans never collect.


def _collect_garbage(device):
    if device.type in ("cpu", "meta"):  # a card's memory is not tracked
        gc.collect()


def _available_after_collecting(device):
    _collect_garbage(device)
    return device_available(device)


def _measured_fit(device, measure, modules):
    """The memory fit of the step measured at _MEASURE_SIZES (a cache
    entry), or None when even those runs do not fit."""
    for attempt in range(2):
        try:
            with leaving_no_trace(modules):
                profs = [profile_memory(device, measure(p)) for p in _MEASURE_SIZES]
            break
        except OutOfMemoryError:
            if attempt == 1:
                return None
            _collect_garbage(device)  # See Note [Garbage and the plan].
    first, exact = fit_lines(profs[0], profs[1], *_MEASURE_SIZES, which=1)
    later, _ = fit_lines(profs[0], profs[1], *_MEASURE_SIZES, which=2)
    allocs = None  # per allocation, to check the fit on a chunk
    if exact:
        allocs = (profs[1][0], allocation_lines(*profs, *_MEASURE_SIZES, which=1),
                  allocation_lines(*profs, *_MEASURE_SIZES, which=2))
    return {"first": first, "later": later, "exact": exact, "scale": 1.0, "allocs": allocs}


# Note [A fit checked on a chunk]
# The fit is measured at 2 and 3 samples, and a kernel may take memory only
# above some size: oneDNN's bf16 matmul on a CPU with native bf16 takes a
# scratch buffer once m*k*n > 16**3, which 2 and 3 samples never reach, so
# chunks planned from the fit ran out and were halved. So the first chunk
# run at a size the fit was not checked at is recorded (no extra step: the
# chunk runs anyway) and compared with the fit allocation by allocation:
# the bytes live at each allocation above its line raise that line, and an
# allocation the fit lacks (the scratch) adds a line through the bytes live
# there, on the slope of the allocation before it, so the fit holds the
# scratch at every size (above the threshold exactly, below it too much:
# the safe side). Raising it by the chunk's excess at its peak alone was
# not enough: at a smaller chunk another phase can bind. The chunks of that
# run are the ones planned before it; later plans (and
# LazyRun.limit_for) use the raised fit. A fit checked at the whole batch
# (a first call under a roomy budget) plans every smaller chunk with what
# the whole batch showed.


def checking_first_chunk(attempt, entry, size, device, reserve):
    """`attempt`, recorded until a chunk completes when `size` (the planned
    chunk) is above any size the fit `entry` was checked at: see Note [A fit
    checked on a chunk]. `reserve`: bytes of .grad the chunk creates."""
    if entry is None or entry.get("allocs") is None or device is None \
            or device.type not in ("cpu", "meta") \
            or size <= entry.get("checked", _MEASURE_SIZES[-1]):
        return attempt
    from ...memory.tracking import track

    done = []

    def checked(start, n, only):
        if done:
            return attempt(start, n, only)
        with track() as t:
            result = attempt(start, n, only)
        events = t.timeline.events()
        done.append(n)
        _raise_fit(entry, n, live_curves(events, device.type), reserve)
        return result

    return checked


def _raise_fit(entry, size, chunk, reserve):
    """Raise the fit by what a chunk of `size` took beyond it, allocation
    by allocation (aligned by op): the live bytes at each allocation the fit
    has, above its line; an allocation it lacks (a scratch buffer) becomes a
    line through the bytes live there, on the slope of the allocation
    before it. The first chunk's gradients are new when `reserve` is (curve
    "first"), else it adds into existing ones (curve "later")."""
    ops, first, later = entry["allocs"]
    seen, other = (first, later) if reserve else (later, first)
    matched = {}
    for i, j, n in difflib.SequenceMatcher(None, ops, chunk[0], autojunk=False) \
            .get_matching_blocks():
        matched.update((j + k, i + k) for k in range(n))
    raises = [0.0] * len(ops)
    added_seen, added_other = [], []
    last = None
    for j, live in enumerate(chunk[1]):
        i = matched.get(j)
        if i is not None:
            raises[i] = max(raises[i], live - (seen[i][0] + seen[i][1] * size))
            last = i
            continue
        if last is None:
            added_seen.append((live, 0.0))
            added_other.append((live, 0.0))
            continue
        up = live - (seen[last][0] + seen[last][1] * size)
        added_seen.append((seen[last][0] + up, seen[last][1]))
        added_other.append((other[last][0] + up, other[last][1]))
    seen = [(a + r, b) for (a, b), r in zip(seen, raises)]
    other = [(a + r, b) for (a, b), r in zip(other, raises)]
    first, later = (seen, other) if reserve else (other, seen)
    added_first, added_later = (added_seen, added_other) if reserve else (added_other, added_seen)
    entry["allocs"] = (ops, first, later)
    entry["first"] = collapsed(entry["first"] + first + added_first)
    entry["later"] = collapsed(entry["later"] + later + added_later)
    entry["checked"] = max(size, entry.get("checked", 0))


# Note [Never worse than eager]: one chunk of the whole batch is the eager
# step itself. Several chunks can need more memory than it: later chunks run
# with the full .grad already allocated and add each new gradient into it,
# so for a small batch or a model whose gradients outweigh its activations
# no split fits where the whole batch does (at 1.0-1.1x the eager peak,
# lazy used to plan chunks of 1 sample and fail). Chunks are planned with a
# 10% margin (the fit is extrapolated from 2 and 3 samples); when no chunk
# size fits that way, the whole batch runs, as eager would, when the fit
# says it fits within WHOLE_SLACK (at exactly the eager peak the fit can be
# bytes over the memory available while the step itself fits; the probes'
# own values are freed before, see drop_probes). A plan that still ran out
# of memory lowers `scale`, and the next plan splits (see learn_from_ooms).


def _split_limit(entry, avail, reserve, extra_per_sample):
    """The largest chunk the fit `entry` gives with the margin kept (it
    never shrinks as `avail` grows), and the (fixed, per sample) line that
    limits it."""
    usable = avail * (1.0 - MARGIN)
    c1, lim1 = solve_lines(entry["first"], usable, extra_per_sample)
    c2, lim2 = solve_lines(entry["later"], usable - reserve, extra_per_sample)
    c, line = (c1, lim1) if c1 <= c2 else (c2, (lim2[0] + reserve, lim2[1]))
    if c != math.inf:
        c = int(c * entry["scale"])
    return c, line


def plan(entry, B, avail, reserve, extra_per_sample):
    """The chunk limit for a batch of B with `avail` bytes available, from a
    measured fit `entry`, and the (fixed, per sample) line that limits it:
    see Note [Never worse than eager]."""
    c, line = _split_limit(entry, avail, reserve, extra_per_sample)
    if c < 1 and entry["scale"] >= 1.0:
        # No split fits: the whole batch is the only step that can, as in
        # eager PyTorch, when the fit (extrapolated from 2 and 3 samples)
        # says it fits, give or take WHOLE_SLACK.
        whole, lim = solve_lines(entry["first"], avail * (1.0 + WHOLE_SLACK), 0.0)
        if whole >= B:
            return B, lim
    return max(1, min(c, B)), line
