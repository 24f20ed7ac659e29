"""The peak of a step over the batch and the length: fitted from steps
recorded at a few (batch, length) shapes, checked at shapes outside them
(see Note [The peak over batch and length]). memfit.profile(...,
seq_dim=) gives its Report this axis; memfit.length_surface fits it
directly."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, Sequence

import torch

from .._native import native as _memfit
from .._step.batching import (count, first_batch_dim, resize_batch, resize_length,
                              sequence_length, target_batch_dim_of)
from .._step.device import host_memory, to_bytes

__all__: list = []


# Note [The peak over batch and length]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# As along the batch (Note [Predicting the peak at any batch], peak_model.h),
# every event of the step gets its own model of the live bytes after it,
# now over the batch b and the length L:
#     M(b, L) = c0 + c1*L + c2*L^2 + b*(c3 + c4*L + c5*L^2)
# fixed bytes (weights, gradients, optimizer state), what grows with the
# length alone (a causal mask of L x L, position ids), per sample (a class
# label), per token (activations of every layer), and per sample per L^2
# (attention that materialises its scores: eager attention; SDPA's flash
# and memory-efficient kernels leave c5 at 0). The peak is the largest event
# at (b, L): exact for any step whose allocations are such polynomials,
# which two batches by three lengths determine. It needs the probes to run
# the same events (as many in each phase, only sizes differ); when they did
# not (a kernel that changes with the shape), each phase's peak is fitted,
# and the notes say so. Either way steps recorded at shapes outside the
# probes (batch and length both) are predicted and the worst relative miss
# is held_out_error: the surface says how far to trust it, never silently.


def _basis(batch, length, quadratic):
    """The terms of M(b, L), see Note [The peak over batch and length]."""
    b, n = float(batch), float(length)
    if quadratic:
        return [1.0, n, n * n, b, b * n, b * n * n]
    return [1.0, n, b, b * n]


def _live_after_each_event(timeline):
    live, out = 0, []
    for kind, nbytes, *_ in timeline.events():
        live += nbytes if kind == "alloc" else -nbytes
        out.append(live)
    return out


def _signature(timeline):
    """What must agree between probes for a per-event fit, as along the
    batch (peak_model.cpp): the phases, and the number of events in each.
    The order of events within a phase may differ by a few (autograd's
    threads): the held-out shapes show what that costs."""
    return tuple((name, it, end - first) for name, it, first, end in timeline.phase_spans())


def _phase_peaks(timeline):
    return {(p.name, p.iteration): p.peak for p in timeline.phase_summaries()}


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """A step recorded outside the probes: predicted against measured."""
    batch: int
    length: int
    predicted_bytes: int
    measured_bytes: int

    @property
    def error(self) -> float:
        """(predicted - measured) / measured: negative under-predicts."""
        return (self.predicted_bytes - self.measured_bytes) / max(1, self.measured_bytes)


@dataclasses.dataclass(frozen=True)
class LengthSurface:
    """The peak over (batch, length), from length_surface or a Report's
    length_surface().

    predict_peak_bytes(batch, length); max_batch(length, budget); probes:
    ((batch, length, measured peak), ...); held_out: HeldOut per shape
    recorded outside the probes; held_out_error: their worst relative miss
    (None when none was recorded); per_event: each event was fitted (else
    each phase's peak); terms: the terms of the model; notes."""

    probes: tuple
    held_out: tuple
    per_event: bool
    terms: tuple
    notes: tuple
    coefficients: torch.Tensor = dataclasses.field(repr=False)  # (terms, events or phases)

    @property
    def held_out_error(self) -> float | None:
        if not self.held_out:
            return None
        return max(abs(h.error) for h in self.held_out)

    @property
    def longest_probe(self) -> int:
        """The longest length recorded (beyond it the surface extrapolates)."""
        return max(n for _, n, _ in self.probes)

    def predict_peak_bytes(self, batch: int, length: int) -> int:
        """The predicted peak of a step of `batch` samples `length` long."""
        batch = count(batch, "LengthSurface.predict_peak_bytes", "batch")
        length = count(length, "LengthSurface.predict_peak_bytes", "length")
        x = torch.tensor(_basis(batch, length, len(self.terms) == 6), dtype=torch.float64)
        return int(round((x @ self.coefficients).max().item()))

    def max_batch(self, length: int, budget: Any) -> int:
        """The largest batch whose predicted peak at `length` is within
        `budget` (bytes or "16GiB"); 0 when one sample is not. A prediction,
        not a verified fit: find_batch_size(..., lengths=) verifies."""
        room = to_bytes(budget, "LengthSurface.max_batch")
        if self.predict_peak_bytes(1, length) > room:
            return 0
        lo, hi = 1, 2
        while self.predict_peak_bytes(hi, length) <= room:
            lo, hi = hi, hi * 2
            if hi > 1 << 40:
                return lo  # the peak does not grow with the batch
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.predict_peak_bytes(mid, length) <= room else (lo, mid)
        return lo

    def text(self) -> str:
        """What the surface rests on, in a few lines."""
        fmt = _memfit.format_bytes
        shapes = ", ".join(f"{b}x{n}" for b, n, _ in self.probes)
        lines = [f"peak over batch x length, {'per event' if self.per_event else 'per phase'} "
                 f"({' + '.join(self.terms)}), from {len(self.probes)} steps: {shapes}"]
        for h in self.held_out:
            lines.append(f"held out {h.batch}x{h.length}: predicted {fmt(h.predicted_bytes)}, "
                         f"measured {fmt(h.measured_bytes)} ({h.error:+.2%})")
        if not self.held_out:
            lines.append("no held-out shape recorded: how close the surface is was not checked")
        return "\n".join(lines + list(self.notes))

    def __repr__(self):
        err = self.held_out_error
        return (f"LengthSurface({len(self.probes)} probes, per_event={self.per_event}, "
                f"held_out_error={'None' if err is None else f'{err:.4f}'})")


def fit_surface(record: Callable, lengths: Sequence[int], batches: Sequence[int],
                held_out: Sequence[tuple] | None = None,
                what: str = "length_surface") -> LengthSurface:
    """The surface of the step `record(batch, length) -> Timeline` records:
    recorded at every (batch, length) of `batches` x `lengths`, each event
    modelled over both (see Note [The peak over batch and length]), then
    checked at `held_out` (batch, length) pairs, recorded and predicted; by
    default one with batch and length both outside the probes:
    max(batches) + min(batches), half way between the two longest lengths.
    held_out=() skips the check (the text says so). Three lengths or more
    fit the L^2 term; two leave it out, and the notes say so."""
    asked = sorted({count(n, what, "each of lengths") for n in lengths})
    sizes = sorted({count(b, what, "each of batches") for b in batches})
    if len(asked) < 2 or len(sizes) < 2:
        raise ValueError(f"[{what}] the surface needs two lengths or more and two batches or "
                         f"more, got lengths={list(lengths)!r}, batches={list(batches)!r}")
    quadratic = len(asked) >= 3
    if held_out is None:
        held_out = [(sizes[-1] + sizes[0], (asked[-2] + asked[-1]) // 2)]
    held_out = [(count(b, what, "held-out batch"), count(n, what, "held-out length"))
                for b, n in held_out]
    shapes = [(b, n) for n in asked for b in sizes]
    timelines = [record(b, n) for b, n in shapes]
    notes = []
    per_event = len({_signature(t) for t in timelines}) == 1
    if per_event:
        ys = [_live_after_each_event(t) for t in timelines]
    else:
        phases = [_phase_peaks(t) for t in timelines]
        keys = sorted(set.intersection(*(set(p) for p in phases)))
        if keys and all(set(p) == set(keys) for p in phases):
            ys = [[p[k] for k in keys] for p in phases]
            notes.append("the probes ran different events (a kernel that changes with the "
                         "shape): each phase's peak is fitted, not each event")
        else:
            ys = [[t.peak().bytes] for t in timelines]
            notes.append("the probes ran different events and phases: the step's peak is "
                         "fitted as one surface")
    if not quadratic:
        notes.append("two lengths: no L^2 term (attention that materialises its scores "
                     "needs three lengths to be modelled)")
    x = torch.tensor([_basis(b, n, quadratic) for b, n in shapes], dtype=torch.float64)
    coefficients = torch.linalg.lstsq(x, torch.tensor(ys, dtype=torch.float64)).solution
    terms = (("1", "L", "L^2", "b", "b*L", "b*L^2") if quadratic else ("1", "L", "b", "b*L"))
    surface = LengthSurface(probes=tuple((b, n, t.peak().bytes) for (b, n), t in
                                         zip(shapes, timelines)),
                            held_out=(), per_event=per_event, terms=terms, notes=tuple(notes),
                            coefficients=coefficients)
    checks = tuple(HeldOut(b, n, surface.predict_peak_bytes(b, n), record(b, n).peak().bytes)
                   for b, n in held_out)
    return dataclasses.replace(surface, held_out=checks)


@dataclasses.dataclass(frozen=True)
class LengthPrediction:
    """The predicted peak at (batch, length) and how sure it is: from
    Report.prediction(batch, length=). held_out_error: the surface's worst
    relative miss at shapes it was not fitted on (None: not checked);
    beyond_probes: `length` is longer than the longest recorded, or
    `batch` smaller than the smallest (an extrapolation); surface: the
    LengthSurface behind it."""

    batch: int
    length: int
    predicted_bytes: int
    surface: LengthSurface

    @property
    def held_out_error(self) -> float | None:
        return self.surface.held_out_error

    @property
    def beyond_probes(self) -> bool:
        return self.length > self.surface.longest_probe or self._below_probes

    @property
    def _below_probes(self) -> bool:
        # A batch under every probe's (batch 1 from probes at 2 and 4) runs
        # kernels the probes did not: the held-out shapes do not cover it.
        return self.batch < min(b for b, _, _ in self.surface.probes)

    def text(self) -> str:
        """The prediction and its check, in a line."""
        err = self.held_out_error
        check = ("not checked at a held-out shape" if err is None else
                 f"held-out shapes within {err:.2%}")
        beyond = (f"; beyond the longest probe ({self.surface.longest_probe})"
                  if self.length > self.surface.longest_probe else "")
        if self._below_probes:
            beyond += (f"; below the smallest probe batch "
                       f"({min(b for b, _, _ in self.surface.probes)}): not covered by them")
        how = "" if self.surface.per_event else "; per phase (the probes ran different events)"
        return (f"peak at batch {self.batch} x length {self.length}: "
                f"{_memfit.format_bytes(self.predicted_bytes)} predicted from "
                f"{len(self.surface.probes)} steps, {check}{beyond}{how}")


def _probe_lengths(longest):
    lengths = sorted({max(1, longest // 4), max(1, longest // 2), longest})
    return lengths if len(lengths) == 3 else [longest, 2 * longest, 3 * longest]


class LengthAxis:
    """A recorded step's length axis: the same step recorded at other
    (batch, length) shapes, the example cut or repeated along batch_dim and
    seq_dim (its target too where it has the length: token labels).

    record_step(**arguments) -> a Report records one step (memfit.profile);
    `arguments` are its arguments as given, inputs and target among them.
    Surfaces are fitted on first use and kept."""

    def __init__(self, record_step: Callable, arguments: dict, seq_dim: Any,
                 what: str = "profile") -> None:
        self.seq_dim = seq_dim
        self.arguments = dict(arguments)
        self.record_step = record_step
        self.what = what
        # Raises here, naming `what`, for a seq_dim no input has.
        self.length = sequence_length(self.arguments["inputs"], seq_dim, what)
        self.surfaces = {}

    def record(self, batch: int, length: int):
        """The Timeline of the step at `batch` samples `length` long."""
        a = self.arguments
        batch_dim = a.get("batch_dim", 0)
        with host_memory():  # memfit's copies: only the step's own count
            x = resize_batch(resize_length(a["inputs"], length, self.seq_dim, self.length,
                                           self.what), batch, batch_dim)
            y = a.get("target")
            if y is not None:
                y = resize_batch(resize_length(y, length, first_batch_dim(self.seq_dim),
                                               self.length, self.what), batch,
                                 target_batch_dim_of(batch_dim, a.get("target_batch_dim")))
        return self.record_step(**{**a, "inputs": x, "target": y}).timeline

    def surface(self, lengths: Sequence[int], batches: Sequence[int],
                held_out: Sequence[tuple] | None = None) -> LengthSurface:
        """The LengthSurface from these probes (see fit_surface), kept."""
        key = (tuple(lengths), tuple(batches), None if held_out is None else tuple(held_out))
        if key not in self.surfaces:
            self.surfaces[key] = fit_surface(self.record, lengths, batches, held_out, self.what)
        return self.surfaces[key]

    def default_surface(self, batch: int, length: int) -> LengthSurface:
        """A surface whose probes reach `length`: one kept already, else
        lengths a quarter, a half and all of max(length, the example's),
        at the example's batch and half of it (at least 2 and 3)."""
        for s in reversed(list(self.surfaces.values())):
            if s.longest_probe >= length:
                return s
        b = batch
        sizes = sorted({max(2, b // 2), max(3, b)})
        return self.surface(_probe_lengths(max(length, self.length)), sizes)


def with_length_axis(profile_fn: Callable) -> Callable:
    """memfit.profile with its seq_dim= argument: the Report gets a
    LengthAxis (report.length_axis) that records the same step, with every
    other argument as given, at other (batch, length) shapes."""
    signature = inspect.signature(profile_fn)

    @functools.wraps(profile_fn)
    def profile(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        seq_dim = arguments.get("seq_dim")
        if seq_dim is None:
            return profile_fn(*args, **kwargs)
        # Checked before the step runs; other recordings compare nothing eager.
        again = {"seq_dim": None}
        if "compare_eager" in arguments:
            again["compare_eager"] = False
        axis = LengthAxis(profile_fn, {**arguments, **again}, seq_dim, "profile")
        report = profile_fn(*args, **kwargs)
        report.length_axis = axis
        return report

    return profile
