"""memfit.length_surface: the peak of a step over the batch and the length,
from steps recorded at a few (batch, length) shapes, checked at shapes
outside them (see Note [The peak over batch and length])."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch

from .._native import native as _memfit
from .._step.batching import (count, first_batch_dim, resize_batch, resize_length,
                              sequence_length)
from .._step.device import host_memory, to_bytes
from .._step.hints import Batch
from ..report.profile import profile

__all__ = ["HeldOut", "LengthSurface", "length_surface"]


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
    """The peak over (batch, length), from length_surface.

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


def length_surface(model: torch.nn.Module, inputs: Batch, target: Batch = None, *,
                   seq_dim: Any, lengths: Sequence[int], batches: Sequence[int] = (2, 4),
                   held_out: Sequence[tuple] | None = None, batch_dim: Any = 0,
                   **profile_kwargs: Any) -> LengthSurface:
    """The peak of `model`'s training step over batch and length: the step
    recorded at every (batch, length) of `batches` x `lengths`, the example
    cut or repeated along batch_dim and seq_dim (its target too where it has
    the length: token labels), each event modelled over both (see Note [The
    peak over batch and length]), then checked at `held_out` shapes, (batch,
    length) pairs recorded and predicted; by default one with batch and
    length both outside the probes: max(batches) + min(batches), half way
    between the two longest lengths. held_out=() skips the check (the notes
    say so). Other keyword arguments go to memfit.profile (loss_fn,
    optimizer, mode, step, ...). Three lengths or more fit the L^2 term of
    materialised attention; two leave it out, and the notes say so.

    Returns a LengthSurface: predict_peak_bytes(batch, length),
    max_batch(length, budget), held_out_error, text()."""
    what = "length_surface"
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
    have = sequence_length(inputs, seq_dim, what)
    target_dim = first_batch_dim(seq_dim)
    target_batch_dim = first_batch_dim(batch_dim)

    def record(b, n):
        with host_memory():  # memfit's copies: only the step's own count
            x = resize_batch(resize_length(inputs, n, seq_dim, have, what), b, batch_dim)
            y = None
            if target is not None:
                y = resize_batch(resize_length(target, n, target_dim, have, what), b,
                                 target_batch_dim)
        return profile(model, x, y, batch_dim=batch_dim, **profile_kwargs).timeline

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
