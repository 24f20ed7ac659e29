"""memfit explain: CUDA memory snapshots from real runs (torch's
_record_memory_history / _dump_snapshot) read in bounded memory and turned
into memfit's timeline: the same table, JSON and HTML page as a profiled
step, findings in the doctor's words, memfit's allocator replay held against
the card's segments, and memfit's prediction of the step beside it."""

from .compare import Comparison, PhaseComparison
from ..diagnosis.records import Finding
from .replay import ReplayCheck
from .snapshot import NotASnapshot, Snapshot, load_snapshot

__all__ = ["Comparison", "Finding", "load_snapshot", "NotASnapshot", "PhaseComparison",
           "ReplayCheck", "Snapshot"]
