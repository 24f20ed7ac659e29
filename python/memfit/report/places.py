"""Where a step is measured: the device the model is on (a CUDA card, or
the simulated device), or a rehearsal on the CPU or meta for a card you do
not have. memfit.profile records the step at a Place, and find_batch_size's
one search (probes, verification, recovery from an out-of-memory probe)
runs over what it records, wherever that is."""

from __future__ import annotations

import array
import contextlib
import dataclasses

import torch

from .._native import native as _memfit
from .._step.user_state import step_bytes

__all__: list = []

MODES = ("device", "cpu", "meta")

CARD_NOTE = ("measured on the card by its caching allocator's counters: each phase's peak "
             "and the reserved bytes; modules and categories are not counted on a card "
             "(mode='cpu' rehearses the step to name them)")

# Note [Measured on the device]
# mode="device" measures the step on the device the model is on, held to
# that device's own limit: an allocation past it raises there, and a probe
# that runs out of memory is recovered (the rehearsal puts the user's
# weights, .grad, optimizer state and RNG back, Note [A rehearsal that runs
# out of memory puts everything back]) and the search goes on from what was
# measured. Two devices:
# - the simulated device (memfit.simulated_device), on the CPU: memfit's
#   tracking allocator is the device's allocator, so its recording is the
#   device's own count, with phases, modules and categories. CI runs the
#   whole device path this way.
# - a CUDA card: memfit's recorder sees only CPU and meta allocations, so
#   the figures come from the caching allocator's own counters, read at
#   each phase boundary (CardCounters): the phases' peaks of allocated bytes
#   and the step's peak of reserved bytes, which a budget is held against.
#   Modules and categories are not counted there (mode="cpu" rehearses the
#   step to name them); the report says so.
# "cpu" and "meta" stay, for planning a card you do not have: the report's
# truth says which one it holds.


@dataclasses.dataclass
class Place:
    """Where a step is measured. mode: "device", "cpu" or "meta". device:
    where the step's copies of the weights, state and batch live. truth: one
    line, what the figures are ("measured on cuda:0 (NVIDIA H200)").
    counters: a card's CardCounters; None where memfit's recorder sees the
    device."""

    mode: str
    device: torch.device
    truth: str
    counters: "CardCounters | None" = None


def card_of(model):
    """The CUDA device `model`'s first parameter (or buffer) is on; None
    off a card."""
    p = next((t for t in list(model.parameters()) + list(model.buffers())), None)
    return p.device if p is not None and p.is_cuda else None


# Note [A card capped at the budget]
# On a card, whether batch N fits a budget is whether its step runs with
# only the budget: torch.cuda.set_per_process_memory_fraction caps what the
# caching allocator may reserve, and a request that would pass the cap has
# the allocator free its cached segments and retry before it raises, as on
# a card that is full. A step measured uncapped keeps whatever cache nothing
# asked it to give back, and a search that holds that reserve to the budget
# stops below the batch the capped card runs (the H200's bench truth is
# plain steps capped this way, docs/benchmarks.md). So on a card the
# searches (find_batch_size, the callbacks' plan_batch, the Trainer's plan)
# run every step, the example's, the probes' and the verifying one, capped
# at the budget: a step that runs fits and one that raises does not, which
# the search already recovers from (Note [Measured on the device]). The
# peak held against the room is then the allocated one; the cap holds the
# reserve. The user's fraction is kept where it is lower, and put back
# after. Uncapped, the user's own steps at the answer may cache more than
# the budget: they run where the card has only the budget.
_capped: dict = {}  # card -> the budget its steps are capped at now


@contextlib.contextmanager
def capped_at_budget(model, budget_bytes: int):
    """Inside: the card `model` is on runs its steps with at most
    `budget_bytes` reserved, See Note [A card capped at the budget]. Nothing
    off a card, inside another cap, or on a torch without
    get_per_process_memory_fraction (the user's fraction could not be put
    back)."""
    card = card_of(model)
    get = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if card is None or get is None or card in _capped:
        yield
        return
    before = get(card)
    total = torch.cuda.get_device_properties(card).total_memory
    torch.cuda.set_per_process_memory_fraction(min(before, budget_bytes / total), card)
    _capped[card] = budget_bytes
    try:
        yield
    finally:
        del _capped[card]
        torch.cuda.set_per_process_memory_fraction(before, card)


def place_of(mode, model, target_device: str, who: str) -> Place:
    """The Place of `mode` (None: "device" where memfit sees the device the
    model is on, a card or the simulated device, else "cpu") for `model`.
    Raises one-line ValueErrors tagged `who` for another mode, or "device"
    where there is no device to measure."""
    card = card_of(model)
    simulated = _memfit.budget("cpu")
    if mode is None:
        mode = "device" if card is not None or simulated is not None else "cpu"
    if mode not in MODES:
        raise ValueError(f"[{who}] mode must be 'device', 'cpu' or 'meta' (or None: the "
                         f"device the model is on where memfit sees it), got {mode!r}")
    fmt = _memfit.format_bytes
    if mode == "device":
        if card is not None:
            name = torch.cuda.get_device_name(card)
            return Place("device", card, f"measured on {card} ({name}) by its caching "
                         f"allocator's counters", CardCounters(card))
        if simulated is None:
            raise ValueError(
                f"[{who}] mode='device' measures the step on the device the model is on, "
                f"and this model is on the CPU with no memfit.simulated_device(...) around "
                f"it: move it to the card, run inside memfit.simulated_device(budget), or "
                f"pass mode='cpu' to rehearse it")
        return Place("device", torch.device("cpu"),
                     f"measured on the simulated device ({fmt(simulated)} budget)")
    card_target = " for a CUDA card" if target_device == "cuda" else ""
    what = "the CPU" if mode == "cpu" else "meta (shapes only)"
    return Place(mode, torch.device(mode), f"rehearsed on {what}{card_target}")


@dataclasses.dataclass
class PhaseSample:
    """A card's counters over one phase: allocated bytes at its start, the
    most allocated during it, and at its end (bytes beside the step taken
    out)."""

    name: str
    iteration: int
    start: int
    peak: int
    end: int


# Category order of the core's event.h.
_PARAMETER, _OTHER = 0, 7


def phase_timeline(samples) -> _memfit.Timeline:
    """A Timeline with each phase's measured peak: per phase, the bytes
    above its start allocated and freed (its transients), then the bytes
    alive at its end in place of those at its start. What the step holds
    after the first phase ("parameters": the weights, .grad and state
    copied in) is counted as parameters; the rest is not told apart."""
    kinds, nbytes, ids, times = (array.array("B"), array.array("q"), array.array("Q"),
                                 array.array("q"))
    categories, modules = array.array("B"), array.array("I")
    spans = []
    live_id, live_bytes, next_id = 0, 0, 1

    def event(kind, n, i, category):
        kinds.append(kind)
        nbytes.append(n)
        ids.append(i)
        times.append(len(times))
        categories.append(category)
        modules.append(0)

    def hold(n, category):  # the bytes alive now become n
        nonlocal live_id, live_bytes, next_id
        if n == live_bytes:
            return
        if live_id:
            event(1, live_bytes, live_id, category)
        live_id, live_bytes = (next_id, n) if n > 0 else (0, 0)
        if live_id:
            event(0, n, live_id, category)
            next_id += 1

    for k, s in enumerate(samples):
        spans.append((len(kinds), s.name, s.iteration))
        category = _PARAMETER if k == 0 else _OTHER
        hold(s.start, category)
        above = max(0, s.peak - live_bytes)
        if above:
            event(0, above, next_id, category)
            event(1, above, next_id, category)
            next_id += 1
        hold(s.end, category)
    return _memfit.timeline_from_events(kinds, nbytes, ids, times, categories, modules, [""],
                                        spans)


class CardCounters:
    """A card's caching-allocator counters read at each phase boundary of a
    step (See Note [Measured on the device]). The whole card adapter: what
    it reads is torch.cuda's, and nothing here runs without a card."""

    def __init__(self, device):
        self.device = device
        self.beside = 0
        self.samples = []
        self.peak_reserved = 0
        self.peak_allocated = 0
        self._open = None

    def begin(self, model, optimizer):
        """Before the step: what the card holds beside the model's next
        step (the batch the user holds, other tensors) is taken out of every
        figure. Each recording then restart()s the peaks."""
        torch.cuda.synchronize(self.device)
        self.beside = torch.cuda.memory_allocated(self.device) - step_bytes(
            model, optimizer, lambda t: t.is_cuda and t.device == self.device)

    def restart(self):
        """A recording starts: the samples and peaks from here. The cache a
        larger probe left is handed back first, or its segments would count
        as this step's reserved bytes."""
        self.samples, self._open = [], None
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self.peak_reserved = torch.cuda.memory_reserved(self.device) - self.beside
        self.peak_allocated = 0

    def phase(self, name, iteration):
        self.end_phase()
        self._open = (name, iteration, self._allocated())

    def end_phase(self):
        if self._open is None:
            return
        torch.cuda.synchronize(self.device)
        name, iteration, start = self._open
        peak = torch.cuda.max_memory_allocated(self.device) - self.beside
        self.samples.append(PhaseSample(name, iteration, start, peak, self._allocated()))
        self.peak_allocated = max(self.peak_allocated, peak)
        # The beside tensors sit in reserved segments too.
        self.peak_reserved = max(self.peak_reserved,
                                 torch.cuda.max_memory_reserved(self.device) - self.beside)
        torch.cuda.reset_peak_memory_stats(self.device)
        self._open = None

    def _allocated(self):
        return torch.cuda.memory_allocated(self.device) - self.beside

    def report(self, model_name, batch, optimizer_name):
        """(C++ report, timeline) of the step from the counters: phases'
        peaks, and the reserved bytes the card held at most (what a budget
        is held against)."""
        timeline = phase_timeline(self.samples)
        native = _memfit.make_report(timeline, model_name, batch, optimizer_name, "device")
        if self.device not in _capped:  # capped, the cap held the reserve: See the Note
            native.set_card_figures(self.peak_allocated, self.peak_reserved)
        return native, timeline

    def note(self):
        """What the figures are, for the report's notes."""
        if self.device not in _capped:
            return CARD_NOTE
        fmt = _memfit.format_bytes
        return (f"{CARD_NOTE}; run with only the budget ({fmt(_capped[self.device])}: the "
                f"card's cap), held to it by its allocated bytes, {fmt(self.peak_reserved)} "
                f"reserved at most (See Note [A card capped at the budget])")
