"""memfit.load_snapshot: a CUDA memory snapshot from a real run, explained.

    torch.cuda.memory._record_memory_history()      # on the GPU machine
    ... train a few steps ...
    torch.cuda.memory._dump_snapshot("snap.pickle")

    s = memfit.load_snapshot("snap.pickle")          # anywhere, no GPU needed
    print(s.table())                                 # phases, categories, findings
    s.peak_allocated_bytes, s.peak_reserved_bytes, s.modules_at_peak
    s.save_html("snap.html")
    s.replay().matches                               # memfit's allocator replay vs the card
    s.compare(memfit.profile(model, x, y, optimizer=opt, target_device="cuda"))
"""

import json
import operator
import os
from typing import Dict, List, Optional, Tuple, Union

from .._native import native as _memfit
from .compare import Comparison, compare_prediction
from ..diagnosis.records import Finding
from .findings import find
from .replay import ReplayCheck, check_replay
from .snapshot_format import ALLOC, NotASnapshot, RawSnapshot, read_snapshot
from .trace import CATEGORIES, TraceEvents, events_of

__all__ = ["NotASnapshot", "Snapshot", "load_snapshot"]

NO_TRACE = ("a snapshot without a trace: record_memory_history was not on (call "
            "torch.cuda.memory._record_memory_history() before the step, then _dump_snapshot)")


class Snapshot:
    """One device's trace of a snapshot as memfit reads it. Build it with
    load_snapshot()."""

    def __init__(self, raw: RawSnapshot, device: Optional[int] = None):
        self.raw = raw
        self.path = raw.path
        busy = [d for d, t in enumerate(raw.traces) if len(t)]
        if not busy:
            raise NotASnapshot(f"{raw.path}: {NO_TRACE}")
        notes = []
        if device is None:
            device = max(busy, key=lambda d: len(raw.traces[d]))
            if len(busy) > 1:
                notes.append(f"devices {busy} have traces; explaining device {device} (the "
                             "longest): pass device= (--device) for another")
        elif device not in busy:
            raise NotASnapshot(f"{raw.path}: device {device} has no trace (devices with one: "
                               f"{busy})")
        self.device = device
        self.events: TraceEvents = events_of(raw, device)
        self.timeline = self.events.timeline
        self.notes: List[str] = notes + self.events.notes
        if raw.unknown_actions:
            self.notes.append("trace actions this reader does not know were skipped: " +
                              ", ".join(f"{k} ({v})" for k, v in raw.unknown_actions.items()))
        self._replay: Optional[ReplayCheck] = None
        self._report = None

    # --- the numbers

    @property
    def trace_entries(self) -> int:
        return len(self.raw.traces[self.device])

    @property
    def peak_allocated_bytes(self) -> int:
        """The most bytes of live blocks at any event (the bytes asked for)."""
        return self.timeline.peak().bytes if len(self.timeline) else 0

    @property
    def peak_reserved_bytes(self) -> int:
        """The most bytes of live segments at any event."""
        return self.events.peak_reserved_bytes

    def _peak_breakdown(self) -> dict:
        if not len(self.timeline):
            return {"categories": {c: 0 for c in CATEGORIES}, "modules": [], "phases": []}
        return self.timeline.breakdown_at_peak()

    @property
    def categories_at_peak(self) -> Dict[str, int]:
        cats = self._peak_breakdown()["categories"]
        return {c: int(cats[c]) for c in CATEGORIES}

    @property
    def modules_at_peak(self) -> List[Tuple[str, int]]:
        """(place in the code, bytes) live at the allocated peak, largest
        first (See Note [Phases and places from a snapshot's frames]); "" is
        memory whose frames name no Python code (the autograd engine's
        thread, or a trace recorded without stacks)."""
        return [(name, int(b)) for name, b in self._peak_breakdown()["modules"]]

    @property
    def trace_complete(self) -> bool:
        return not (self.events.pre_existing or self.events.reserved_at_start)

    def fragmentation(self) -> dict:
        """Reserved minus allocated at the reserved peak, and the cache at
        the dump (free bytes, largest free block)."""
        ev = self.events
        at_peak_reserved = ev.peak_reserved_bytes
        allocated = 0
        if ev.peak_reserved_trace_index >= 0 and len(self.timeline):
            # Live bytes once the allocation the new segment was made for
            # (the next event, when it allocates) has its block.
            k = _last_event_at(ev.trace_index, ev.peak_reserved_trace_index)
            actions = self.raw.traces[self.device].action
            if k + 1 < len(ev.trace_index) and actions[ev.trace_index[k + 1]] == ALLOC:
                k += 1
            allocated = self.timeline.live_after(k) if k >= 0 else 0
        segs = [s for s in self.raw.segments if s.device == self.device]
        free_blocks = [b.size for s in segs for b in s.blocks if b.state == "inactive"]
        reserved = sum(s.total_size for s in segs)
        return {
            "at_reserved_peak": {"reserved_bytes": at_peak_reserved,
                                 "allocated_bytes": allocated,
                                 "gap_bytes": max(0, at_peak_reserved - allocated)},
            "at_dump": {"reserved_bytes": reserved,
                        "allocated_bytes": sum(s.allocated_size for s in segs),
                        "free_bytes": sum(free_blocks),
                        "largest_free_block": max(free_blocks, default=0),
                        "segments": len(segs)},
        }

    # --- the reports

    def replay(self) -> ReplayCheck:
        """memfit's caching-allocator replay on this trace, held against the
        card (memfit.explain.replay)."""
        if self._replay is None:
            self._replay = check_replay(self.raw, self.events)
        return self._replay

    def findings(self) -> List[Finding]:
        return find(self.events, self.raw, self.fragmentation(), self.replay())

    def report(self):
        """memfit's step report of the trace (phases, categories at the peak,
        activations per place): the native Report the table, JSON and HTML
        page of `memfit profile` are drawn from."""
        if self._report is None:
            if not len(self.timeline):
                raise NotASnapshot(f"{self.path}: the trace holds no allocation")
            r = _memfit.make_report(self.timeline, os.path.basename(self.path), 0,
                                    self.events.optimizer, "cuda snapshot")
            r.notes = list(self.notes)
            self._report = r
        return self._report

    def table(self, max_modules: int = 10) -> str:
        if isinstance(max_modules, bool) or not isinstance(max_modules, int) or max_modules < 0:
            raise ValueError(f"[table] max_modules must be an int >= 0 (the places listed), got "
                             f"{type(max_modules).__name__} {max_modules!r}")
        fb = _memfit.format_bytes
        r = self.report()
        head = [f"memfit explain: {self.path} (device {self.device}, {self.trace_entries} "
                f"trace entries, optimizer {self.events.optimizer})",
                f"peak allocated {fb(self.peak_allocated_bytes)} in {r.peak_phase} (iteration "
                f"{r.peak_iteration}); peak reserved {fb(self.peak_reserved_bytes)}"]
        body = r.table(max_modules).split("\n", 2)[2]  # its own head is memfit profile's
        lines = head + [""] + [body.strip("\n")]
        findings = self.findings()
        if findings:
            lines += ["", f"findings ({len(findings)}):"]
            for i, f in enumerate(findings, 1):
                lines.append(f"{i}. {f.kind}{' at ' + f.where if f.where else ''}: {f.seen}")
                lines.append(f"   fix: {f.fix}")
        lines += ["", self.replay().summary()]
        return "\n".join(lines)

    def as_dict(self) -> dict:
        r = self.report()
        return {
            "file": self.path,
            "device": self.device,
            "trace_entries": self.trace_entries,
            "events": len(self.timeline),
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "peak_phase": r.peak_phase,
            "peak_iteration": r.peak_iteration,
            "categories_at_peak": self.categories_at_peak,
            "modules_at_peak": [{"module": m, "bytes": b} for m, b in self.modules_at_peak],
            "optimizer": self.events.optimizer,
            "trace_complete": self.trace_complete,
            "fragmentation": self.fragmentation(),
            "ooms": [{"trace_index": o.trace_index, "size": o.size,
                      "device_free": o.device_free, "reserved_bytes": o.reserved}
                     for o in self.events.ooms],
            "findings": [f.as_dict() for f in self.findings()],
            "replay": self.replay().as_dict(),
            "allocator_settings": self.raw.allocator_settings,
            "notes": list(self.notes),
            "report": json.loads(r.to_json(False)),
        }

    def to_json(self, pretty: bool = True) -> str:
        return json.dumps(self.as_dict(), indent=2 if pretty else None)

    def html(self, title: Optional[str] = None, x_axis: str = "events") -> str:
        """One self-contained page: the report's (`memfit profile --html`),
        the findings and the replay among its notes. x_axis: "events" (each
        allocation and free one step along) or "time"; a trace's clock also
        runs while nothing allocates (loading, data, the host), which left a
        step squeezed into the end of a time axis."""
        if x_axis not in ("events", "time"):
            raise ValueError(f"[html] x_axis must be 'events' or 'time', got {x_axis!r}")
        r = self.report()
        notes = list(r.notes)
        r.notes = (notes + [f"{f.line()} Fix: {f.fix}" for f in self.findings()]
                   + [self.replay().summary()])
        try:
            return _memfit.html_report(
                r, self.timeline, title=title or f"memfit explain: {os.path.basename(self.path)}",
                x_axis=x_axis)
        finally:
            r.notes = notes

    def save_html(self, path, title: Optional[str] = None, x_axis: str = "events") -> str:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.html(title, x_axis))
        return str(path)

    def compare(self, report, timeline=None) -> Comparison:
        """memfit's prediction beside this snapshot: `report` is what
        memfit.profile(..., target_device="cuda") returns (or a native report
        with its CUDA estimate, with `timeline` the one it was made from)."""
        if not hasattr(report, "cuda") or not hasattr(report, "peak_bytes"):
            raise ValueError(f"[compare] report must be what memfit.profile(..., "
                             f"target_device='cuda') returns, got {type(report).__name__}")
        timeline = timeline if timeline is not None else getattr(report, "timeline", None)
        if timeline is None:
            raise ValueError("[compare] give the prediction's timeline: memfit.profile's "
                             "report carries it")
        return compare_prediction(self.timeline, self.events.reserved_after,
                                  self.peak_allocated_bytes, self.peak_reserved_bytes,
                                  report, timeline)

    def __repr__(self):
        return (f"Snapshot({self.path!r}, device={self.device}, "
                f"peak_allocated_bytes={self.peak_allocated_bytes}, "
                f"peak_reserved_bytes={self.peak_reserved_bytes})")


def _last_event_at(trace_index, ti) -> int:
    """The last timeline event whose trace entry is at or before `ti`."""
    lo, hi = 0, len(trace_index)
    while lo < hi:
        mid = (lo + hi) // 2
        if trace_index[mid] <= ti:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


def load_snapshot(path: Union[str, "os.PathLike[str]"], device: Optional[int] = None) -> Snapshot:
    """The CUDA memory snapshot at `path` (torch.cuda.memory._dump_snapshot),
    read in bounded memory and explained. Raises NotASnapshot (a ValueError)
    with one line for a file that is not one or has no trace."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"[load_snapshot] path must be the snapshot file's path, got "
                        f"{type(path).__name__} {path!r}")
    if device is not None:
        try:
            index = None if isinstance(device, bool) else operator.index(device)
        except TypeError:
            index = None
        if index is None:
            raise TypeError(f"[load_snapshot] device must be the CUDA device's index, an int "
                            f"(or None: the longest trace), got {type(device).__name__} "
                            f"{device!r}")
        device = index
    raw = read_snapshot(path)
    if not raw.has_trace_key or not any(len(t) for t in raw.traces):
        raise NotASnapshot(f"{raw.path}: {NO_TRACE}")
    return Snapshot(raw, device)
