"""A run's memory step by step: each allocation's size, lifetime and user
line, and each step's live and peak bytes, from the timeline's events and
the observer's records."""

import bisect
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .records import UNKNOWN_SITE, Observation, Site

__all__: list = []


@dataclass
class Allocation:
    """One tracked allocation made during the run."""

    id: int
    bytes: int
    alloc_event: int
    free_event: Optional[int]  # None: still alive when the run ended
    site: Site  # the user's line; a forward's output: the line that called it
    func: str  # the torch call that allocated it
    forward: Optional[int]  # the forward whose output it is
    # Allocated by a call whose result requires grad: an activation (or
    # output) of an autograd graph, alive while the graph or the user holds it.
    in_graph: bool

    def alive_after(self, event):
        """Alive once `event` was processed."""
        return self.alloc_event <= event and (self.free_event is None or self.free_event > event)

    def alive_at_boundary(self, event):
        """Alive when the events before `event` were processed."""
        return self.alive_after(event - 1)


@dataclass(frozen=True)
class Step:
    """Events [first_event, end_event) of one complete step. peak: the most
    bytes alive in it (all tracked bytes of the run, not counting what was
    allocated before the doctor started), after event peak_event."""

    index: int
    first_event: int
    end_event: int
    live_before: int
    live_after: int
    peak: int
    peak_event: int


@dataclass
class Run:
    """What the checks read."""

    observation: Observation
    step_kind: str  # "optimizer step" or "forward"
    steps: Tuple[Step, ...]
    allocations: Dict[int, Allocation]
    live: List[int]  # bytes alive after each event
    # The last step ends at the loop's last torch call, not where a next
    # step began: the temporaries of that call's line are still alive there.
    last_step_cut: bool = False

    def live_before(self, event):
        return self.live[event - 1] if event > 0 and self.live else 0

    def step_of(self, event):
        """Index of the complete step holding `event`: -1 before the first,
        len(steps) after the last."""
        i = bisect.bisect_right(self._starts, event) - 1
        if i < 0:
            return -1
        return len(self.steps) if event >= self.steps[i].end_event else i

    @property
    def steady_steps(self):
        """The steps after the first, which sets things up (optimizer state,
        the first gradients, lazy modules)."""
        return self.steps[1:]

    def __post_init__(self):
        self._starts = [s.first_event for s in self.steps]


def _boundaries(observation, finished):
    """(kind, [(first_event, end_event)] of each complete step, whether the
    last one was cut at the loop's last torch call). A step is
    complete once the next one began: what follows the last optimizer step
    is the loop's end, not a step. The last forward's step is complete when
    the block `finished` (exited without an exception) after it: it ends
    after the last torch call the loop made (what the loop's end frees
    after that is not the step's)."""
    ends = [m.event for m in observation.markers if m.kind == "optimizer_step"]
    if ends:
        return "optimizer step", list(zip([0] + ends[:-1], ends)), False
    starts = sorted(m.event for m in observation.markers if m.kind == "forward")
    ends = starts[1:]
    # A StopRun at a forward marks it and raises before it is recorded: that
    # mark ends the last step already.
    cut = finished and bool(starts) and len(starts) == len(observation.forwards)
    if cut:
        last = starts[-1]
        ends.append(max([observation.forwards[-1].end_event]
                        + [s.end_event for s in observation.spans if s.first_event >= last]))
    return "forward", list(zip(starts, ends)), cut


def build_run(events, observation, finished=False):
    """The Run of a timeline's `events()` tuples and the observer's
    Observation; `finished`: the block exited without an exception (see
    _boundaries)."""
    outputs = {}
    for f in observation.forwards:
        for i in f.output_ids:
            outputs.setdefault(i, f)
    spans = sorted(observation.spans, key=lambda s: s.first_event)
    allocations = {}
    live, total = [], 0
    span_i, current = 0, None
    for index, event in enumerate(events):
        kind, nbytes, ident = event[0], event[1], event[2]
        if kind == "alloc":
            while span_i < len(spans) and spans[span_i].first_event <= index:
                current = spans[span_i]
                span_i += 1
            in_span = current is not None and current.first_event <= index < current.end_event
            site = current.site if in_span else UNKNOWN_SITE
            func = current.func if in_span else ""
            in_graph = in_span and current.requires_grad
            forward = outputs.get(ident)
            if forward is not None:
                site = forward.site
            allocations[ident] = Allocation(ident, nbytes, index, None, site, func,
                                            forward.index if forward is not None else None,
                                            in_graph)
            total += nbytes
        else:
            a = allocations.get(ident)
            if a is not None and a.free_event is None:
                a.free_event = index
                total -= a.bytes
        live.append(total)

    kind, ranges, cut = _boundaries(observation, finished)
    steps = []
    for i, (first, end) in enumerate(ranges):
        before = live[first - 1] if first > 0 and live else 0
        peak, peak_event = before, first - 1
        for e in range(first, min(end, len(live))):
            if live[e] > peak:
                peak, peak_event = live[e], e
        after = live[end - 1] if end > 0 and live else 0
        steps.append(Step(i, first, end, before, after, peak, peak_event))
    return Run(observation, kind, tuple(steps), allocations, live, cut)
