"""A snapshot's trace as memfit events: allocations and frees become a
Timeline (so the reports of a recorded step follow), with phases, places
and categories, and the reserved bytes beside it. The walk over the trace
is the core's, in one pass (core/model/snapshot_events.h: See Note
[Allocated and reserved bytes from a trace] and Note [Workspaces in a
snapshot] there); what each stack's frames say, its phase and its place in
the code, is read here once per stack (frames.py).
"""

import array
from dataclasses import dataclass, field
from typing import List, Tuple

from .._native import native as _memfit
from ..diagnosis.frames import is_user_file
from .frames import classify_stack, is_python_file, place_of
from .snapshot_format import RawSnapshot

__all__: list = []

# Category order of memfit's core (event.h).
CATEGORIES = ("parameter", "buffer", "input", "activation", "gradient", "optimizer_state",
              "temporary", "other", "workspace")
# Bytes of a library's workspace (See Note [Workspaces in a snapshot]).
WORKSPACE_SIZES = tuple(_memfit.SNAPSHOT_WORKSPACE_SIZES)


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


def _stack_phase(frames) -> str:
    """The phase a stack's frames say, "user" for only the user's own code (a
    tensor made by hand), "" when they do not say."""
    phase = classify_stack(frames)
    if phase is None:
        py = [f for f in frames if is_python_file(f.filename)]
        if py and all(is_user_file(f.filename) for f in py):
            phase = "user"
    return phase or ""


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
    reserved bytes from a trace], core/model/snapshot_events.cpp)."""
    t = raw.traces[device]
    segments = [s for s in raw.segments if s.device == device]
    live = [(b.address, b.requested_size or b.size, b.stack)
            for s in segments for b in s.blocks if b.state.startswith("active")]
    stack_frames = [[raw.frames[i] for i in stack] for stack in raw.stacks]
    e = _memfit.snapshot_events(
        t.action, t.addr, t.size, t.stream, t.time_us, t.stack,
        reserved_at_dump=sum(s.total_size for s in segments), live_at_dump=live,
        stack_phase=[_stack_phase(f) for f in stack_frames],
        stack_place=[place_of(f) for f in stack_frames])
    stacks = list(_column(e["stacks"], "I"))
    return TraceEvents(
        device=device, timeline=e["timeline"], trace_index=_column(e["trace_index"], "q"),
        reserved_after=_column(e["reserved_after"], "q"), stacks=stacks,
        peak_reserved_bytes=e["peak_reserved_bytes"],
        peak_reserved_trace_index=e["peak_reserved_trace_index"],
        reserved_at_start=e["reserved_at_start"], allocated_at_start=e["allocated_at_start"],
        pre_existing=e["pre_existing"], ooms=[OomEvent(*o) for o in e["ooms"]],
        spans=e["spans"], phase_of_alloc=e["phase_of_alloc"],
        optimizer=_optimizer_of(raw, set(stacks)), notes=e["notes"],
        expandable=e["expandable"])


def _column(data: bytes, code: str) -> array.array:
    a = array.array(code)
    a.frombytes(data)
    return a
