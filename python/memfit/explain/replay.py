"""memfit's caching-allocator replay held against a real card: run on the
snapshot's own allocation trace, its reserved bytes are compared with the
trace's at every allocation and free, its peak with the trace's peak, and
its segments at the end with the segments of the dump. See Note
[Replaying a snapshot's trace] (src/core/allocator_trace.cpp)."""

import array
from dataclasses import dataclass, field
from typing import List, Optional

from .._native import native as _memfit
from .snapshot_format import (ALLOC, FREE_COMPLETED, FREE_REQUESTED, SEGMENT_ALLOC,
                              SEGMENT_FREE, RawSnapshot)
from .trace import TraceEvents

__all__ = ["ReplayCheck"]

TOLERANCE = 0.01  # the bound on reserved bytes at every event


@dataclass
class ReplayCheck:
    """status: "checked" (compared at every allocation and free),
    "incomplete" (the trace starts after the allocator held memory: the
    replay, which starts empty, is not comparable), "not replayed" (a trace
    the replay does not model, e.g. expandable segments)."""

    status: str
    reason: str = ""
    events_compared: int = 0
    events_off: int = 0  # compared events whose reserved bytes differ
    max_rel_error: float = 0.0
    peak_reserved_measured: int = 0
    peak_reserved_replayed: int = 0
    segments_measured: List[int] = field(default_factory=list)  # sizes at the dump
    segments_replayed: List[int] = field(default_factory=list)
    # The first event where the replay's reserved bytes differ: its trace
    # index, the card's reserved bytes there and the replay's.
    first_off: Optional[tuple] = None

    @property
    def within_tolerance(self) -> bool:
        return self.status == "checked" and self.max_rel_error <= TOLERANCE

    @property
    def peak_exact(self) -> bool:
        return self.status == "checked" and self.peak_reserved_measured == self.peak_reserved_replayed

    @property
    def segments_match(self) -> bool:
        return self.status == "checked" and self.segments_measured == self.segments_replayed

    @property
    def matches(self) -> bool:
        return self.within_tolerance and self.peak_exact and self.segments_match

    def summary(self) -> str:
        fb = _memfit.format_bytes
        if self.status != "checked":
            return f"allocator replay {self.status}: {self.reason}"
        s = (f"allocator replay on this trace: reserved bytes off at {self.events_off} of "
             f"{self.events_compared} allocations and frees (largest error "
             f"{self.max_rel_error * 100:.2f}%); peak reserved {fb(self.peak_reserved_replayed)} "
             f"replayed, {fb(self.peak_reserved_measured)} on the card")
        s += "; segments at the dump: " + (
            f"the same {len(self.segments_measured)}" if self.segments_match else
            f"{len(self.segments_replayed)} replayed ({fb(sum(self.segments_replayed))}), "
            f"{len(self.segments_measured)} on the card ({fb(sum(self.segments_measured))})")
        return s

    def as_dict(self) -> dict:
        return {
            "status": self.status, "reason": self.reason,
            "events_compared": self.events_compared, "events_off": self.events_off,
            "max_rel_error": self.max_rel_error,
            "within_tolerance": self.within_tolerance, "tolerance": TOLERANCE,
            "peak_reserved_measured": self.peak_reserved_measured,
            "peak_reserved_replayed": self.peak_reserved_replayed,
            "peak_exact": self.peak_exact,
            "segments_measured": self.segments_measured,
            "segments_replayed": self.segments_replayed,
            "segments_match": self.segments_match,
            "first_off": None if self.first_off is None else {
                "trace_index": self.first_off[0], "reserved_measured": self.first_off[1],
                "reserved_replayed": self.first_off[2]},
        }


def check_replay(raw: RawSnapshot, events: TraceEvents) -> ReplayCheck:
    """Replays the trace of events.device and compares (See the module's
    docstring)."""
    device = events.device
    segments = sorted(s.total_size for s in raw.segments if s.device == device)
    if events.expandable or any(s.is_expandable for s in raw.segments if s.device == device):
        return ReplayCheck("not replayed", "the trace was recorded with expandable_segments "
                           "(segment_map/unmap): memfit replays the default allocator only",
                           segments_measured=segments)
    if events.reserved_at_start or events.pre_existing:
        return ReplayCheck(
            "incomplete",
            f"the trace starts with {_memfit.format_bytes(events.reserved_at_start)} reserved "
            f"and {events.pre_existing} allocations made before recording began; the replay "
            "starts from an empty cache, so it is not comparable (record from the program's "
            "first CUDA allocation)", segments_measured=segments)
    t = raw.traces[device]
    action, addr, size, stream = t.action, t.addr, t.size, t.stream
    free_action = FREE_COMPLETED if FREE_COMPLETED in action else FREE_REQUESTED
    kinds, ids, nbytes, streams = (array.array("B"), array.array("Q"), array.array("q"),
                                   array.array("q"))
    at = array.array("q")  # per op: its trace index (-1: not compared)
    measured = array.array("q")  # per op: the card's reserved bytes after it
    live = {}
    reserved = 0
    peak = 0
    next_id = 1
    prev = -1
    for i in range(len(t)):
        a = action[i]
        if a == SEGMENT_ALLOC:
            reserved += size[i]
            peak = max(peak, reserved)
        elif a == SEGMENT_FREE:
            reserved -= size[i]
            if prev != SEGMENT_FREE:  # a run of releases: one release of the cache
                kinds.append(2); ids.append(0); nbytes.append(0); streams.append(0)
                at.append(-1); measured.append(0)
        elif a == ALLOC:
            live[addr[i]] = next_id
            kinds.append(0); ids.append(next_id); nbytes.append(size[i]); streams.append(stream[i])
            at.append(i); measured.append(reserved)
            next_id += 1
        elif a == free_action:
            j = live.pop(addr[i], None)
            if j is not None:
                kinds.append(1); ids.append(j); nbytes.append(0); streams.append(0)
                at.append(i); measured.append(reserved)
        prev = a
    # A release's reserved bytes are compared at the next allocation or free:
    # the card's run of segment_frees ends there.
    rep_reserved, _, rep_segments, _ = _memfit.replay_allocator_ops(kinds, ids, nbytes, streams)
    replayed = array.array("q")
    replayed.frombytes(rep_reserved)
    check = ReplayCheck("checked", peak_reserved_measured=peak,
                        peak_reserved_replayed=max(replayed, default=0),
                        segments_measured=segments, segments_replayed=list(rep_segments))
    for k in range(len(at)):
        if at[k] < 0:
            continue
        check.events_compared += 1
        m, r = measured[k], replayed[k]
        if m != r:
            check.events_off += 1
            err = abs(r - m) / max(m, 1)
            check.max_rel_error = max(check.max_rel_error, err)
            if check.first_off is None:
                check.first_off = (at[k], m, r)
    return check
