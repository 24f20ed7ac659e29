"""A snapshot's trace as memfit events: allocations and frees become a
Timeline (so the reports of a recorded step follow), with phases, places
and categories read from the frames, and the reserved bytes beside it.

Note [Allocated and reserved bytes from a trace]
- Allocated: an "alloc" entry makes `size` bytes live (the bytes asked for,
  as memory_viz draws them); they die at its "free_requested", where torch's
  own allocated-bytes counter drops (the block waits for other streams until
  "free_completed"). Traces recorded with free_requested skipped die at
  free_completed.
- Reserved: the running sum of segment_alloc - segment_free (and, with
  expandable segments, segment_map - segment_unmap), starting from what was
  reserved when recording began: the segments at the dump minus the trace's
  net change.
- Recording may start after the program allocated (or a ring buffer of
  max_entries may have dropped the oldest entries): frees of blocks never
  allocated in the trace, and blocks live at the dump that the trace never
  allocated, were live at its start. They are counted from the first event
  (so the allocated peak is still a lower bound of the truth, and said to be).
"""

import array
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .._native import native as _memfit
from ..diagnosis.frames import is_user_file
from .frames import classify_stack, is_python_file, place_of
from .snapshot_format import (ALLOC, FREE_COMPLETED, FREE_REQUESTED, OOM, SEGMENT_ALLOC,
                              SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, RawSnapshot)

__all__ = ["CATEGORIES", "WORKSPACE_SIZES", "OomEvent", "TraceEvents", "events_of"]

# Category order of memfit's core (event.h).
CATEGORIES = ("parameter", "buffer", "input", "activation", "gradient", "optimizer_state",
              "temporary", "other", "workspace")
_CAT = {c: i for i, c in enumerate(CATEGORIES)}
_BY_PHASE = {"parameters": "parameter", "inputs": "input", "forward": "activation",
             "loss": "activation", "backward": "gradient", "optimizer_step": "optimizer_state"}


@dataclass
class OomEvent:
    """An "oom" entry: the request that failed, and what was live then."""

    trace_index: int
    size: int  # the rounded request that failed
    device_free: int  # what CUDA said was free
    stream: int
    stack: int
    events_before: int  # timeline events before it: breakdown_after(events_before - 1)
    reserved: int  # reserved bytes at it


@dataclass
class TraceEvents:
    """One device's trace as memfit events."""

    device: int
    timeline: object  # _memfit.Timeline
    trace_index: array.array  # per timeline event: its trace entry (-1: live before the trace)
    reserved_after: array.array  # per timeline event: reserved bytes right after it
    stacks: List[int]  # per allocation event (timeline order): its stack
    peak_reserved_bytes: int
    peak_reserved_trace_index: int  # -1: the trace never reserved more than at its start
    reserved_at_start: int
    allocated_at_start: int  # live bytes counted from before the trace
    pre_existing: int  # allocations counted from before the trace
    ooms: List[OomEvent]
    spans: List[Tuple[int, str, int]]  # (first event, phase, iteration)
    phase_of_alloc: List[str]  # per allocation event
    optimizer: str  # what the frames show ran: adam | sgd | a torch/optim file | none
    notes: List[str] = field(default_factory=list)
    expandable: bool = False  # segment_map/unmap seen


def _stack_phase(raw: RawSnapshot, cache: Dict[int, Optional[str]], sid: int) -> Optional[str]:
    hit = cache.get(sid, 0)
    if hit != 0:
        return hit
    frames = [raw.frames[i] for i in raw.stacks[sid]]
    phase = classify_stack(frames)
    if phase is None:
        py = [f for f in frames if is_python_file(f.filename)]
        if py and all(is_user_file(f.filename) for f in py):
            phase = "user"  # only the user's own code: a tensor made by hand
    cache[sid] = phase
    return phase


def _optimizer_of(raw: RawSnapshot, sids) -> str:
    for sid in sids:
        for i in raw.stacks[sid]:
            fn = raw.frames[i].filename
            if "/optim/" in fn and fn.endswith(".py"):
                base = fn.rsplit("/", 1)[-1][:-3]
                if base not in ("optimizer", "__init__", "lr_scheduler"):
                    return base  # adam, adamw, sgd, ...
    return "none"


def events_of(raw: RawSnapshot, device: int) -> TraceEvents:
    """The trace of `device` as memfit events (See Note [Allocated and
    reserved bytes from a trace])."""
    t = raw.traces[device]
    n = len(t)
    action, addr, size, stream, time_us, stack = (t.action, t.addr, t.size, t.stream,
                                                  t.time_us, t.stack)
    free_action = FREE_REQUESTED if FREE_REQUESTED in action else FREE_COMPLETED
    segments = [s for s in raw.segments if s.device == device]

    # Pass 1: what was live before the trace, and the reserved bytes at its start.
    live: Dict[int, int] = {}  # addr -> size
    pre: List[Tuple[int, int, int]] = []  # (addr, size, stack) live at the start
    net_reserved = 0
    expandable = False
    for i in range(n):
        a = action[i]
        if a == ALLOC:
            live[addr[i]] = size[i]
        elif a == free_action:
            if live.pop(addr[i], None) is None:
                pre.append((addr[i], size[i], stack[i]))
        elif a == SEGMENT_ALLOC or a == SEGMENT_MAP:
            net_reserved += size[i]
            expandable |= a == SEGMENT_MAP
        elif a == SEGMENT_FREE or a == SEGMENT_UNMAP:
            net_reserved -= size[i]
            expandable |= a == SEGMENT_UNMAP
    freed_before = {p[0] for p in pre}
    for s in segments:
        for b in s.blocks:
            if (b.state.startswith("active") and b.address not in live
                    and b.address not in freed_before):
                pre.append((b.address, b.requested_size or b.size, b.stack))
    del live, freed_before
    notes: List[str] = []
    reserved_at_start = sum(s.total_size for s in segments) - net_reserved
    if reserved_at_start < 0:
        notes.append(f"the segments at the dump hold {-reserved_at_start} bytes less than the "
                     "trace reserved: segments of other memory pools are not in the dump")
        reserved_at_start = 0

    # Pass 2: the events, in order, with their phase labels. Allocations
    # live before the trace come first, so their frees in the trace find them.
    phase_cache: Dict[int, Optional[str]] = {}
    kinds = array.array("B")
    nbytes = array.array("q")
    ids = array.array("Q")
    times = array.array("q")
    trace_index = array.array("q")
    reserved_after = array.array("q")
    labels: List[Optional[str]] = []  # per event: the phase its frames say
    alloc_stack: List[int] = []  # per allocation event, in order
    alloc_of: Dict[int, Tuple[int, int]] = {}  # addr -> (event, stack) of its live allocation
    t0 = time_us[0] if n else 0
    reserved = reserved_at_start
    peak_reserved, peak_reserved_at = reserved, -1
    ooms: List[OomEvent] = []

    def allocate(a_, nb, sid, ti, time_ns):
        alloc_of[a_] = (len(kinds), sid)
        kinds.append(0)
        nbytes.append(nb)
        ids.append(len(alloc_stack) + 1)
        times.append(time_ns)
        trace_index.append(ti)
        reserved_after.append(reserved)
        labels.append(_stack_phase(raw, phase_cache, sid))
        alloc_stack.append(sid)

    def free(j, ti, time_ns, label):
        kinds.append(1)
        nbytes.append(nbytes[j])
        ids.append(ids[j])
        times.append(time_ns)
        trace_index.append(ti)
        reserved_after.append(reserved)
        labels.append(label)

    for a_, sz, sid in pre:
        allocate(a_, sz, sid, -1, 0)
    allocated_at_start = sum(p[1] for p in pre)
    for i in range(n):
        a = action[i]
        if a == ALLOC:
            prev = alloc_of.pop(addr[i], None)
            if prev is not None:  # a free the trace did not record
                free(prev[0], i, (time_us[i] - t0) * 1000, None)
            allocate(addr[i], size[i], stack[i], i, (time_us[i] - t0) * 1000)
        elif a == free_action:
            j = alloc_of.pop(addr[i], None)
            if j is None:
                continue
            # A free's own frames (context="all") say its phase (zero_grad,
            # ...); frames equal to its allocation's say nothing new.
            sid = stack[i]
            free(j[0], i, (time_us[i] - t0) * 1000,
                 _stack_phase(raw, phase_cache, sid) if sid != j[1] else None)
        elif a == SEGMENT_ALLOC or a == SEGMENT_MAP:
            reserved += size[i]
            if reserved > peak_reserved:
                peak_reserved, peak_reserved_at = reserved, i
        elif a == SEGMENT_FREE or a == SEGMENT_UNMAP:
            reserved -= size[i]
        elif a == OOM:
            ooms.append(OomEvent(i, size[i], addr[i], stream[i], stack[i], len(kinds), reserved))

    spans, phase_of_alloc = _spans(labels, kinds)
    categories = _categories(kinds, ids, spans, phase_of_alloc, trace_index, nbytes)
    places: Dict[int, int] = {}
    place_names = [""]
    modules = array.array("I")
    k = 0
    for e in range(len(kinds)):
        if kinds[e] == 0:
            sid = alloc_stack[k]
            k += 1
            m = places.get(sid)
            if m is None:
                name = place_of([raw.frames[f] for f in raw.stacks[sid]])
                try:
                    m = place_names.index(name)
                except ValueError:
                    place_names.append(name)
                    m = len(place_names) - 1
                places[sid] = m
            modules.append(m)
        else:
            modules.append(0)
    timeline = _memfit.timeline_from_events(
        kinds, nbytes, ids, times, categories, modules, place_names, spans)
    if pre:
        notes.append(
            f"the trace starts after {len(pre)} allocations were made ({allocated_at_start} "
            "bytes): they are counted live from its start, so the allocated peak is a lower "
            "bound; call torch.cuda.memory._record_memory_history() before the first CUDA "
            "allocation (and with max_entries large enough) for a complete trace")
    return TraceEvents(
        device=device, timeline=timeline, trace_index=trace_index,
        reserved_after=reserved_after, stacks=alloc_stack,
        peak_reserved_bytes=peak_reserved, peak_reserved_trace_index=peak_reserved_at,
        reserved_at_start=reserved_at_start, allocated_at_start=allocated_at_start,
        pre_existing=len(pre), ooms=ooms, spans=spans, phase_of_alloc=phase_of_alloc,
        optimizer=_optimizer_of(raw, set(alloc_stack)), notes=notes, expandable=expandable)


def _spans(labels, kinds):
    """Phase spans from the phase each event's frames say: an undecided
    event takes the phase around it; "user" (only the user's code, a tensor
    made by hand) is the inputs between steps and undecided inside one; an
    iteration begins at a forward after a backward."""
    spans: List[Tuple[int, str, int]] = []
    current, iteration, seen_backward = None, 1, False
    phase_of_alloc: List[str] = []
    first_pending = None
    for e, label in enumerate(labels):
        phase = label
        if phase == "user":
            phase = "inputs" if current in (None, "parameters", "optimizer_step",
                                             "zero_grad") else None
        if phase is not None and phase != current:
            if phase in ("forward", "inputs") and seen_backward:
                iteration += 1
                seen_backward = False
            if phase == "backward":
                seen_backward = True
            if current is None and spans == [] and e > 0:
                spans.append((0, "other", 1))
            spans.append((e, phase, 1 if phase == "parameters" else iteration))
            current = phase
        if kinds[e] == 0:
            phase_of_alloc.append(current or "other")
    if not spans:
        spans.append((0, "other", 1))
    return spans, phase_of_alloc


def _outlives(free_event, backward_end) -> bool:
    """Whether an allocation freed at `free_event` (None: never) outlives
    its iteration's backward (None: the trace has none)."""
    return backward_end is not None and (free_event is None or free_event >= backward_end)


# Note [Workspaces in a snapshot]
# cuBLAS keeps a workspace per (handle, stream) and a handle per thread,
# allocated through the caching allocator at the thread's first matmul and
# never freed: 32 MiB on Hopper, 8 MiB + 128 KiB on older cards, and
# cuBLASLt's 1 MiB beside it (Note [cuBLAS workspaces on the card],
# report.h). In a trace they are blocks of those sizes that the forward (the
# caller's thread) or the backward (autograd's thread, with no Python frame)
# allocates and the trace never frees. Called gradients, the backward's
# 32 MiB made explain report 13.5x the parameters of gradients and a false
# "gradients kept" on every H200 snapshot. The first block of each size in
# each thread's phases is its workspace; a later one is the step's own.
WORKSPACE_SIZES = (32 << 20, (8 << 20) + (128 << 10), 1 << 20)
_THREAD_OF_PHASE = {"forward": "caller", "loss": "caller", "backward": "autograd"}


def _categories(kinds, ids, spans, phase_of_alloc, trace_index, nbytes):
    """Each allocation's category, from its phase and its lifetime (See Note
    [Allocated and reserved bytes from a trace] for pre-existing ones): freed
    inside its own phase span, a temporary; else what that phase leaves
    (activations after forward and loss, gradients after backward, state
    after the optimizer's step). A library's workspace is its own (See Note
    [Workspaces in a snapshot]). What forward makes and its iteration's
    backward does not free is no activation (a cache, an output the loop
    keeps): other."""
    n = len(kinds)
    free_at: Dict[int, int] = {}
    for e in range(n - 1, -1, -1):
        if kinds[e] == 1:
            free_at[ids[e]] = e
    span_end = array.array("q", [0] * n)
    span_iteration = array.array("q", [0] * n)
    bounds = [s[0] for s in spans] + [n]
    backward_end: Dict[int, int] = {}  # iteration -> the end of its backward
    for k in range(len(spans)):
        if spans[k][1] == "backward":
            backward_end[spans[k][2]] = bounds[k + 1]
        for e in range(bounds[k], bounds[k + 1]):
            span_end[e] = bounds[k + 1]
            span_iteration[e] = spans[k][2]
    out = array.array("B")
    a = 0
    workspaces = set()  # (thread, size) seen
    for e in range(n):
        if kinds[e] != 0:
            out.append(_CAT["other"])
            continue
        phase = phase_of_alloc[a]
        a += 1
        f = free_at.get(ids[e])
        thread = _THREAD_OF_PHASE.get(phase)
        if (f is None and thread is not None and trace_index[e] >= 0
                and nbytes[e] in WORKSPACE_SIZES and (thread, nbytes[e]) not in workspaces):
            workspaces.add((thread, nbytes[e]))
            out.append(_CAT["workspace"])
        elif phase in ("parameters", "inputs"):
            out.append(_CAT[_BY_PHASE[phase]])
        elif trace_index[e] < 0:
            out.append(_CAT["other"])
        elif f is not None and f < span_end[e]:
            out.append(_CAT["temporary"])
        elif phase in ("forward", "loss") and _outlives(f, backward_end.get(span_iteration[e])):
            out.append(_CAT["other"])
        else:
            out.append(_CAT[_BY_PHASE.get(phase, "other")])
    return out
