"""What a profile of a compiled model says beside the step: what compiling
cost at each batch it recorded, and the eager step compared, when asked."""

from __future__ import annotations

from typing import Any, Callable

from .._native import native as _memfit
from .._step.compiled import CompileCost

__all__: list = []


def saving_line(compiled_peak: int, eager_peak: int) -> str:
    """"compiling saves 224 MiB (33%) of this step's peak: ..." from two
    measured peaks ("costs" when compiling raised it)."""
    fb = _memfit.format_bytes
    d = eager_peak - compiled_peak
    verb = "saves" if d >= 0 else "costs"
    share = abs(d) / eager_peak if eager_peak else 0.0
    return (f"compiling {verb} {fb(abs(d))} ({share:.0%}) of this step's peak: "
            f"{fb(compiled_peak)} compiled, {fb(eager_peak)} eager (both steps recorded)")


class CompiledRecordings:
    """A compiled model's recordings in one profile (its probes and
    verifications too): `log` is (batch, CompileCost) in order, `costs` the
    first at each batch; `eager_peak` the eager step's peak once recorded by
    record_eager() (a callable returning a Report's native)."""

    def __init__(self, paths: list[str], record_eager: Callable[[], Any]) -> None:
        self.paths = paths
        self.log = []
        self.costs = {}
        self.eager_peak = None
        self._record_eager = record_eager

    def add(self, batch: int, cost: CompileCost) -> list[str]:
        """Keeps the recording's cost; returns its notes."""
        self.log.append((batch, cost))
        self.costs.setdefault(batch, cost)
        if cost.ran_eager:
            return [cost.ran_eager]
        where = ", ".join(p or "the model" for p in self.paths)
        how = ("recorded warm, after compiling" if cost.recorded_warm else
               "it compiled again at every call, so it was recorded as it runs, compiling "
               "included")
        notes = [f"compiled ({where}): the step {how}; compiling is counted apart, never in "
                 f"the step's bytes: {cost.line()}"]
        notes.append("allocations inside compiled code are the compiled module's, not its "
                     "submodules' (inductor fuses across them)")
        return notes

    def comparison(self, report: Any) -> str:
        """The saving line for `report`'s batch, the eager step recorded on
        first use."""
        if self.eager_peak is None:
            self.eager_peak = self._record_eager().peak_bytes
        return saving_line(report.peak_bytes, self.eager_peak)


def search_notes(report: Any, fit: Any) -> list[str]:
    """What find_batch_size's answer says of a compiled model (report: the
    profile its search probed; fit: the BatchFit): whether the probes
    shared one graph, and whether the verified step at the answer ran the
    probes' graph or compiled its own."""
    log = report.compile_log
    if not log:
        return []
    notes = []
    probes = [(b, c) for b, c in log[1:] if b != fit.max_batch]
    compiled = [(b, c) for b, c in probes if c.compiled]
    if probes:
        if len(compiled) <= 1:
            first = f" (compiled once, at batch {compiled[0][0]}: {compiled[0][1].seconds:.1f} s)" \
                if compiled else ""
            notes.append(f"compiled: the {len(probes)} probe steps ran one compiled graph{first}")
        else:
            notes.append(f"compiled: {len(compiled)} of the {len(probes)} probe steps compiled a "
                         f"graph of their own (recompiles: {compiled[-1][1].recompiles[:1]}); each "
                         f"was recorded warm")
    if fit.verified:
        at = [c for b, c in log if b == fit.max_batch]
        if at and at[-1].compiled:
            why = at[-1].recompiles[0] if at[-1].recompiles else "a new graph"
            notes.append(f"compiled: the step at batch {fit.max_batch} ran a graph other than the "
                         f"probes' (it compiled again: {why}); the answer is that step, measured "
                         f"warm")
        elif at:
            notes.append(f"compiled: verified with the compiled step at batch {fit.max_batch}, "
                         f"warm, on the probes' graph (no recompile)")
    return notes
