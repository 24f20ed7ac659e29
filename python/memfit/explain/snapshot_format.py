"""Reading a CUDA memory snapshot (the pickle torch.cuda.memory._dump_snapshot
writes) in bounded memory, without unpickling it: the file is read by the
core's pickle machine (src/core/snapshot_reader.cpp, Note [Reading a
snapshot in bounded memory]); this module gives its result Python types.

The format is the dict torch/cuda/memory.py documents in _snapshot() and
torch/cuda/_memory_viz.py reads: {"segments": [Segment], "device_traces":
[[TraceEntry] per device], "allocator_settings": {...}, ...}. A TraceEntry
is {"action", "addr" (or "device_free" for an oom), "size", "stream",
"time_us", "frames", ...}; a Segment {"address", "total_size", "stream",
"segment_type", "allocated_size", "active_size", "device", "is_expandable",
"blocks": [{"address", "size", "requested_size", "state", "frames"}]}; a
frame {"filename", "line", "name"}.

A Python pickle machine read 1.4 MB/s here (a 1 GB snapshot in 12 minutes);
the C++ one reads about 80 MB/s in the same memory.
"""

import array
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from .._native import native as _memfit

__all__ = ["NotASnapshot"]

# Trace actions in torch's words (TraceEntry::Action); the code is the index.
ACTIONS = tuple(_memfit.SNAPSHOT_ACTIONS)
ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, \
    SEGMENT_UNMAP, OOM, SNAPSHOT = range(9)

# The file is not a torch memory snapshot; the message is the one line to show.
NotASnapshot = _memfit.SnapshotFormatError


@dataclass(frozen=True)
class Frame:
    filename: str
    line: int
    name: str


@dataclass
class Block:
    address: int
    size: int
    requested_size: int
    state: str  # active_allocated | active_pending_free | inactive
    stack: int  # index into RawSnapshot.stacks (0: no frames)


@dataclass
class Segment:
    device: int
    address: int
    total_size: int
    stream: int
    segment_type: str  # small | large
    allocated_size: int
    active_size: int
    is_expandable: bool
    blocks: List[Block]


@dataclass
class DeviceTrace:
    """One device's trace entries as columns, in order. For an oom entry
    `addr` holds its device_free (the bytes CUDA said were free) and `size`
    the rounded request that failed."""

    action: array.array = field(default_factory=lambda: array.array("B"))
    addr: array.array = field(default_factory=lambda: array.array("Q"))
    size: array.array = field(default_factory=lambda: array.array("q"))
    stream: array.array = field(default_factory=lambda: array.array("q"))
    time_us: array.array = field(default_factory=lambda: array.array("q"))
    stack: array.array = field(default_factory=lambda: array.array("I"))

    def __len__(self) -> int:
        return len(self.action)


@dataclass
class RawSnapshot:
    """A snapshot as read: frames and stacks interned once for the file.
    stacks[i] is a tuple of frame indices, innermost call first (as torch
    writes them); stacks[0] is the empty stack."""

    path: str
    segments: List[Segment]
    traces: List[DeviceTrace]  # one per device, as device_traces
    frames: List[Frame]
    stacks: List[Tuple[int, ...]]
    allocator_settings: Dict[str, str]  # each value as Python prints it
    unknown_actions: Dict[str, int]  # actions this reader does not know: count
    has_trace_key: bool  # the file had "device_traces" at all


# torch's _profile_to_snapshot (a snapshot made from torch.profiler) writes
# frames as {"filename": "none", "line": 0, "name": "path.py(LINE): function"},
# and a module's call as "nn.Module: Linear_0".
_PROFILER_FRAME = re.compile(r"^(.*)\((\d+)\): (.*)$")


def _frame(filename: str, line: int, name: str) -> Frame:
    if filename in ("none", "") and not line:
        m = _PROFILER_FRAME.match(name)
        if m:
            return Frame(m.group(1), int(m.group(2)), m.group(3))
    return Frame(filename, line, name)


def _column(data: bytes, code: str) -> array.array:
    a = array.array(code)
    a.frombytes(data)
    return a


def read_snapshot(path) -> RawSnapshot:
    """The snapshot at `path`, read in bounded memory. Raises NotASnapshot
    (a ValueError) with one line for a file that is not one, OSError for
    one that cannot be read."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such file")
        what = "a directory" if os.path.isdir(path) else "not a regular file (a device or a pipe)"
        raise NotASnapshot(f"{path}: {what}: give the file torch.cuda.memory._dump_snapshot "
                           "wrote")
    try:
        raw = _memfit.read_snapshot(path)
    except RuntimeError as e:  # the C++ reader's I/O errors
        raise OSError(str(e)) from None
    traces = []
    for t in raw.pop("traces"):  # each column copied once, the bytes dropped
        traces.append(DeviceTrace(
            action=_column(t["action"], "B"), addr=_column(t["addr"], "Q"),
            size=_column(t["size"], "q"), stream=_column(t["stream"], "q"),
            time_us=_column(t["time_us"], "q"), stack=_column(t["stack"], "I")))
    segments = [
        Segment(device=s["device"], address=s["address"], total_size=s["total_size"],
                stream=s["stream"], segment_type=s["segment_type"],
                allocated_size=s["allocated_size"], active_size=s["active_size"],
                is_expandable=s["is_expandable"],
                blocks=[Block(*b) for b in s["blocks"]])
        for s in raw["segments"]
    ]
    return RawSnapshot(
        path=path,
        segments=segments,
        traces=traces,
        frames=[_frame(*f) for f in raw["frames"]],
        stacks=[tuple(s) for s in raw["stacks"]],
        allocator_settings=dict(raw["allocator_settings"]),
        unknown_actions=dict(raw["unknown_actions"]),
        has_trace_key=raw["has_traces"],
    )
