"""The largest batch per sequence length: memfit.find_batch_size(...,
seq_dim=1, lengths=[128, 512, 2048]) fits the batch at each length asked,
and answers for the lengths between from the measured ones, never above
what fits (see Note [Between measured lengths])."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch

from .._native import native as _memfit
from .._step.batching import (count, first_batch_dim, map_tensors, resize_batch,
                              resize_length, sequence_length, target_batch_dim_of, tensors_in)
from .._step.device import host_memory
from .ranks import RankFailed, gathered_from_ranks

__all__: list = []


# Note [Between measured lengths]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# At each measured length L_i the fit gives a line in the batch, M_i(b) =
# M0_i + m_i*b: m_i the bytes per sample between its two largest measured
# steps (where max_batch is the only one at or below it, as at a length
# that fits one sample, it and the next batch recorded above it), M0_i
# chosen so that the line goes through the peak measured at max_batch
# (the verified step). Between L_lo and L_hi, at the fraction t
# of the way, at(L) is the largest b with
#     (1 - t) * M_lo(b) + t * M_hi(b) <= 0.98 * (budget - margin),
# clamped to [max_batch(L_hi), max_batch(L_lo)]. The peak at a fixed batch
# is mostly convex in the length (per token, plus the length squared where
# attention materialises its scores; a max of such phases is convex too),
# and a chord lies above a convex function: so the answer is at most what
# fits, with the line measured at both ends (the 2%: below). A kernel whose memory jumps
# with the length breaks convexity: each interior measured length is
# predicted from its neighbours' lines (between_error), and where that
# prediction fell short, at() keeps that fraction of the budget free.
# at(L, between="next") takes the fit of the next measured length instead
# (safe for any peak that grows with the length), and the sampler's first
# batch is its largest, so a jump shows at once.
#
# A peak can also jump between two measured lengths, where no measured
# length shows it: a model that pads its input to a multiple inside forward
# (Longformer's attention window, a kernel's tile) runs 129 tokens as 256.
# So each gap is checked where the fit can answer: one step is run at the
# chord's answer one token past the shorter length (a multiple padded
# upward jumps there) and half way. A check above what the budget leaves
# backs off by its overshoot and runs again, as the search's verification
# does: a card's allocator rounds each block, so the chord's bytes can be
# a few blocks short at a batch no probe ran. Nor is every peak convex in
# the length: a packed LSTM fitted at 8 and 32 tokens in 1.5 MiB peaked
# above the chord between them by 0.09% (20 tokens), 0.66% (13), 1.61%
# (17) and 0.83% (23), and at 21 x 21 it ran out, 140 B over the budget,
# where the checks at 9 and 20 fit. So between measured lengths the
# chord's answer keeps 2% of the budget free (at(21) is 20 there) and
# predict_peak_bytes adds 2% to the chord. Where the gap keeps 90% of
# the chord's batch or more, at() answers that fraction of it there; past
# that the gap jumps: at() there answers the longer length's batch, as
# between="next", and a note names the length, the batch and the bytes.
# A model that takes only some lengths (tokens grouped in patches) is
# checked at the next multiple of the measured lengths' gcd instead; where
# no step runs in a gap, it jumps. The checks are samples, not a proof: a
# jump elsewhere in a gap is found only by measuring more lengths.


# How far below a step's peak the chord between two measured lengths was
# seen to run: kept free at the lengths between (See Note [Between
# measured lengths]).
_CHORD_SHORTFALL = 0.02


@dataclasses.dataclass(frozen=True)
class _Line:
    """M0 + per_sample * b, the line of one measured length."""
    fixed: float
    per_sample: float


def _line(fit) -> _Line | None:
    """The line through the peak at fit.max_batch with the slope of its two
    largest measured steps; where only max_batch ran at or below it (a
    length that fits one sample), the slope up to the next batch measured
    above it (a rehearsal records a step above the budget); None when one
    batch ran."""
    points, above = {}, {}
    for p in fit.probes:
        if not p.out_of_memory and p.peak_bytes > 0:
            into = points if p.batch <= fit.max_batch else above
            into[p.batch] = max(into.get(p.batch, 0), p.peak_bytes)
    at_max = fit.measured_peak_bytes if fit.measured_peak_bytes >= 0 else fit.predicted_peak_bytes
    points[fit.max_batch] = max(points.get(fit.max_batch, 0), at_max)
    if len(points) < 2 and above:
        points[min(above)] = above[min(above)]
    if len(points) < 2:
        return None
    (b1, p1), (b2, p2) = sorted(points.items())[-2:]
    per_sample = max(0.0, (p2 - p1) / (b2 - b1))
    return _Line(fixed=p2 - per_sample * b2, per_sample=per_sample)


@dataclasses.dataclass(frozen=True)
class _View:
    """What one rank measured that at() reads between lengths: each
    length's line (None when one batch ran) and what its budget leaves,
    how the lines predict the lengths between (between_error), the gaps
    that jump. Plain values: ranks send theirs to each other."""
    lines: dict
    rooms: dict
    between_error: float | None
    jumps: tuple
    scales: tuple = ()  # ((lo, hi), f): the chord's batch times f there, checked

    def chord(self, lo, hi, length):
        """(fixed, per_sample) of the step at `length` between lo and hi, as
        the chord of their lines; None where a line is missing."""
        a, b = self.lines[lo], self.lines[hi]
        if a is None or b is None:
            return None
        t = (length - lo) / (hi - lo)
        return ((1 - t) * a.fixed + t * b.fixed, (1 - t) * a.per_sample + t * b.per_sample)


def _between_error(fits) -> float | None:
    """See LengthFit.between_error."""
    measured = list(fits)
    worst = None
    for lo, mid, hi in zip(measured, measured[1:], measured[2:]):
        f = fits[mid]
        a, b = _line(fits[lo]), _line(fits[hi])
        if a is None or b is None or f.measured_peak_bytes <= 0:
            continue
        t = (mid - lo) / (hi - lo)
        predicted = ((1 - t) * (a.fixed + a.per_sample * f.max_batch)
                     + t * (b.fixed + b.per_sample * f.max_batch))
        error = (predicted - f.measured_peak_bytes) / f.measured_peak_bytes
        worst = error if worst is None or error < worst else worst
    return worst


def _view_of(fits, jumps, scales) -> _View:
    return _View(lines={n: _line(f) for n, f in fits.items()},
                 rooms={n: f.budget_bytes - f.margin_bytes for n, f in fits.items()},
                 between_error=_between_error(fits), jumps=tuple(jumps), scales=tuple(scales))


@dataclasses.dataclass(frozen=True)
class LengthFit:
    """The largest batch at each measured length, from find_batch_size(...,
    seq_dim=, lengths=).

    fits: {length: BatchFit}, ascending. at(L): the largest batch at any
    length up to the longest measured (see Note [Between measured lengths]);
    predict_peak_bytes(batch, length); max_tokens: min over the measured
    lengths L of at(L) * L, so that rows padded or packed to a measured L
    fit whenever rows * L <= max_tokens (a packed row longer than the
    longest measured is not covered: attention over it grows with its
    square; measure its length); between_error: how the lines of two
    measured lengths predict the one between them (None under three
    lengths); jumps: the gaps (lo, hi) where a checked step ran above the
    chord; table(): one line per length. Under torch.distributed at(L) is
    the same on every rank: the smallest of every rank's answer."""

    fits: dict
    seq_dim: Any
    notes: tuple = ()
    jumps: tuple = ()
    scales: tuple = ()  # ((lo, hi), f): See Note [Between measured lengths]
    ranks: tuple = ()  # every rank's _View under torch.distributed, else ()

    @property
    def lengths(self) -> list[int]:
        return list(self.fits)

    @property
    def longest(self) -> int:
        return max(self.fits)

    @property
    def verified(self) -> bool:
        return all(f.verified for f in self.fits.values())

    @property
    def max_tokens(self) -> int:
        return min(f.max_batch * length for length, f in self.fits.items())

    def _check(self, length, what):
        length = count(length, what, "length")
        if length > self.longest:
            raise ValueError(
                f"[{what}] length {length} is above the longest measured, {self.longest}: "
                f"memory grows with the length, so no batch is known to fit there; pass it "
                f"in find_batch_size's lengths=")
        return length

    def _neighbours(self, length):
        """(L_lo, L_hi): the measured lengths around `length` (equal when
        it is measured; L_lo None below the shortest)."""
        measured = self.lengths
        hi = next(m for m in measured if m >= length)
        lower = [m for m in measured if m <= length]
        return (lower[-1] if lower else None), hi

    def _views(self):
        return self.ranks or (_view_of(self.fits, self.jumps, self.scales),)

    def at(self, length: int, between: str = "surface") -> int:
        """The largest batch whose step fits at `length` tokens per sample
        (padded): measured at a length asked; between two, from their lines
        ("surface", see Note [Between measured lengths]) or the fit of the
        next longer one ("next"); below the shortest, the shortest's.
        Raises ValueError above the longest measured."""
        length = self._check(length, "LengthFit.at")
        if between not in ("surface", "next"):
            raise ValueError(f"[LengthFit.at] between must be 'surface' or 'next', got "
                             f"{between!r}")
        lo, hi = self._neighbours(length)
        if lo is None or lo == hi or between == "next":
            return self.fits[hi].max_batch
        return min(self._chord_batch(view, lo, hi, length) for view in self._views())

    def _chord_batch(self, view, lo, hi, length, scaled=True):
        """One rank's largest batch at `length` between lo and hi; unscaled,
        the chord's own (not clamped to the measured batches)."""
        high, low = self.fits[hi].max_batch, self.fits[lo].max_batch
        chord = None if (lo, hi) in view.jumps else view.chord(lo, hi, length)
        if chord is None:
            return high
        fixed, per_sample = chord
        if per_sample <= 0:
            return low
        # A length whose peak the chord missed from below: see Note
        # [Between measured lengths].
        room = (min(view.rooms[lo], view.rooms[hi]) * (1 - _CHORD_SHORTFALL)
                / (1 + max(0.0, -(view.between_error or 0.0))) - fixed)
        if not scaled:
            return room / per_sample
        scale = dict(view.scales).get((lo, hi), 1.0)
        return max(high, min(low, math.floor(scale * room / per_sample)))

    def _room(self, lo, hi):
        """What the step may take at lengths between lo and hi: the budget
        less the larger of their margins."""
        return min(f.budget_bytes - f.margin_bytes for f in (self.fits[lo], self.fits[hi]))

    def predict_peak_bytes(self, batch: int, length: int) -> int:
        """The peak of a step of `batch` samples padded to `length`, from
        the lines of the measured lengths around it (see Note [Between
        measured lengths]); below the shortest, the shortest's line; in a
        gap that jumps, the longer length's line; under torch.distributed
        the largest of the ranks'."""
        batch = count(batch, "LengthFit.predict_peak_bytes", "batch")
        length = self._check(length, "LengthFit.predict_peak_bytes")
        lo, hi = self._neighbours(length)
        predicted = []
        for view in self._views():
            b = view.lines[hi]
            if b is None:
                # One batch ran there: more samples hold at most as many
                # times its peak (the fixed bytes are not negative).
                f = self.fits[hi]
                peak = f.measured_peak_bytes if f.measured_peak_bytes >= 0 else \
                    f.predicted_peak_bytes
                predicted.append(int(math.ceil(peak * max(1.0, batch / f.max_batch))))
                continue
            chord = (None if lo is None or lo == hi or (lo, hi) in view.jumps
                     else view.chord(lo, hi, length))
            if chord is None:  # the longer length's line: an upper bound
                predicted.append(int(round(b.fixed + b.per_sample * batch)))
            else:
                fixed, per_sample = chord
                predicted.append(int(round((fixed + per_sample * batch)
                                           * (1 + _CHORD_SHORTFALL))))
        return max(predicted)

    @property
    def between_error(self) -> float | None:
        """The worst (predicted - measured) / measured peak at a measured
        length's answer, predicted from the lines of the lengths on either
        side as at() does between them: positive is the margin at(L)
        keeps, negative a length where the peak is not convex (at() may
        then be above what fits: use between="next")."""
        return _between_error(self.fits)

    def table(self) -> str:
        """One line per measured length: its largest batch, the tokens a
        padded step holds there, the peak measured at that batch."""
        fmt = _memfit.format_bytes
        rows = [("length", "max batch", "tokens", "peak", "verified")]
        for length, f in self.fits.items():
            peak = f.measured_peak_bytes if f.measured_peak_bytes >= 0 else f.predicted_peak_bytes
            rows.append((str(length), str(f.max_batch), str(f.max_batch * length), fmt(peak),
                         "yes" if f.verified else "no"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
        first = next(iter(self.fits.values()))
        lines.append(f"budget {fmt(first.budget_bytes)}; max_tokens {self.max_tokens}")
        if self.between_error is not None:
            lines.append(f"between measured lengths: a length's peak predicted from its "
                         f"neighbours' at {self.between_error:+.2%} (worst)")
        return "\n".join(lines + list(self.notes))

    def __repr__(self):
        sizes = ", ".join(f"{length}: {f.max_batch}" for length, f in self.fits.items())
        return (f"LengthFit({{{sizes}}}, max_tokens={self.max_tokens}, "
                f"verified={self.verified})")


def fit_lengths(fit_one: Callable, inputs, target, seq_dim, lengths, batch_dim=0,
                step_peak: Callable | None = None, across_ranks: Any = True,
                target_batch_dim: int | None = None) -> LengthFit:
    """find_batch_size at each of `lengths`: `fit_one(inputs, target)`
    fits one example batch (find_batch_size with the user's other
    arguments); the example is cut or repeated along `seq_dim` to each
    length (see resize_length: its target too where it has that length).
    step_peak(inputs, target): the peak the budget is held against of one
    step on that batch, None where it ran out of memory; given, each gap
    between measured lengths is checked (See Note [Between measured
    lengths]). across_ranks, target_batch_dim: as find_batch_size's (each
    fit_one agrees already). Raises DoesNotFit naming the length where even
    one sample does not fit."""
    what = "find_batch_size"
    asked = _asked_lengths(seq_dim, lengths, what)
    have = sequence_length(inputs, seq_dim, what)
    target_dim = first_batch_dim(seq_dim)
    fits = {}
    for n in asked:
        with host_memory():  # memfit's copies: only the step's own count
            x = at_full_length(resize_length(inputs, n, seq_dim, have, what), n, have)
            x = with_padding(x, seq_dim)
            y = None if target is None else resize_length(target, n, target_dim, have, what)
        try:
            fits[n] = fit_one(x, y)
        except _memfit.DoesNotFit as e:
            done = ", ".join(f"{m}: {f.max_batch}" for m, f in fits.items())
            raise _memfit.DoesNotFit(
                f"[{what}] at length {n}: {e}" + (f" (fitted so far: {done})" if done else "")
            ) from e
        except (IndexError, RuntimeError) as e:
            if isinstance(e, (torch.cuda.OutOfMemoryError, RankFailed)):
                raise
            named = _length_error(e, n, have, x, y, seq_dim, what)
            if named is None:
                raise
            raise named from e
    notes = []
    if len(asked) == 1:
        notes.append("one length measured: at(L) below it is its batch, above it refused")
    notes += [n for n in (lengths_tensor_note(inputs, have), padding_note(inputs, seq_dim)) if n]
    kept = _kept_at_the_examples_length(inputs, seq_dim)
    if kept:
        notes.append(f"not resized with the length (no seq_dim for them): {', '.join(kept)}; "
                     f"every length is fitted with them as in the example, and a batch where "
                     f"one is longer (a seq2seq target longer than the example's) runs past the "
                     f"fit: make the example's as long as the data's longest")
    fit = LengthFit(fits=fits, seq_dim=seq_dim, notes=tuple(notes))

    def checked():
        if step_peak is None or len(asked) == 1:
            return fit
        example = _Example(inputs, target, seq_dim, have, batch_dim,
                           target_batch_dim_of(batch_dim, target_batch_dim, what))
        return _checked_between(fit, lambda n, b: step_peak(*example.at(n, b)))

    return _agreed_between(checked, across_ranks, what)


def _asked_lengths(seq_dim, lengths, what):
    """The lengths to fit, sorted and each once; one-line errors for what
    is not."""
    if seq_dim is None or lengths is None:
        raise ValueError(f"[{what}] a fit per length takes both seq_dim= (the dimension of the "
                         f"inputs that indexes tokens) and lengths= (the lengths to fit, e.g. "
                         f"[128, 512, 2048]); got seq_dim={seq_dim!r}, lengths={lengths!r}")
    if isinstance(lengths, (int, str, bytes)) or not hasattr(lengths, "__iter__"):
        raise ValueError(f"[{what}] lengths must be a list of ints, got "
                         f"{type(lengths).__name__} {lengths!r}")
    asked = sorted({count(n, what, "each of lengths") for n in lengths})
    if not asked:
        raise ValueError(f"[{what}] lengths is empty: give the lengths to fit")
    return asked


def _length_error(e, n, have, x, y, seq_dim, what):
    """The ValueError that names why the step at length `n` (the example
    `have` long, resized to x, y) raised `e`, or None where it is the
    user's own (at the example's own length)."""
    if n == have:  # nothing was resized
        return None
    first = (str(e).splitlines() or [""])[0]
    square = next((tuple(t.shape) for t in tensors_in(x)
                   if n in t.shape[1:] and have in t.shape[1:]), None)
    if square is not None:
        # A second length dimension (a pairwise mask) was left as it was.
        return ValueError(
            f"[{what}] at length {n} the step raised {type(e).__name__}: {first}; an "
            f"input of shape {square} was resized to {n} along seq_dim and is still "
            f"{have} long along another dimension: seq_dim resizes one dimension per "
            f"input, so a (batch, L, L) mask is not resized. Build it inside forward "
            f"from a (batch, L) mask, or fit each length with find_batch_size on an "
            f"example of that length")
    left = next((tuple(t.shape) for t in ([] if y is None else tensors_in(y))
                 if isinstance(seq_dim, int) and seq_dim >= t.dim()
                 and have in t.shape[1:]), None)
    if left is not None:
        # A per-token target has one dimension fewer than its inputs.
        dims = next(t.dim() for t in tensors_in(x) if t.dim() > seq_dim)
        return ValueError(
            f"[{what}] at length {n} the step raised {type(e).__name__}: {first}; the "
            f"target of shape {left} has no dimension seq_dim={seq_dim} and was left "
            f"{have} long: a per-token target has a dimension fewer than its inputs, so "
            f"count seq_dim from the end, where both have it (seq_dim={seq_dim - dims} "
            f"here)")
    if n < have:
        # The example cut: seq_dim names a dimension the model needs whole
        # (features, not the sequence), or the model takes no shorter input.
        shapes = ", ".join(str(tuple(t.shape)) for t in tensors_in(x))
        return ValueError(
            f"[{what}] at length {n} (the example cut from {have} to {n} along "
            f"seq_dim={seq_dim}, inputs now {shapes}) the step raised {type(e).__name__}: "
            f"{first}; check that seq_dim is the dimension of the sequence, or, for a model "
            f"that takes no shorter input (a convolution's kernel), fit only lengths it takes")
    # The example repeated past its own length: a length the model may not
    # take (its position embeddings, a max_length).
    return ValueError(
        f"[{what}] at length {n} (the example's {have} tokens repeated to {n}) the step "
        f"raised {type(e).__name__}: {first}; a model that takes at most some length "
        f"(position embeddings, a max_length) fails so: fit only lengths it takes")


def _agreed_between(checked: Callable, across_ranks, what) -> LengthFit:
    """checked() (the LengthFit, its gaps checked) with every rank's lines:
    each rank's lines differ with its device, the batches between lengths
    must not (a sampler per rank builds the same batches), so at(L) takes
    the smallest rank's answer (See Note [One answer on every rank])."""
    done = {}

    def view():
        done["fit"] = checked()
        return _view_of(done["fit"].fits, done["fit"].jumps, done["fit"].scales)

    _, views = gathered_from_ranks(view, across_ranks, what)
    if views is None:
        return done["fit"]
    jumps = tuple(sorted({gap for v in views for gap in v.jumps}))
    return dataclasses.replace(done["fit"], jumps=jumps, ranks=tuple(views))


# Note [A tensor of each sample's length]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A model that packs its batch (pack_padded_sequence's lengths, beside the
# tokens in its inputs) runs each sample's own tokens: its memory follows
# those values, not the padded shape. Left as the example's, a length
# repeated to 256 still ran the example's 24 tokens per sample (an LSTM:
# at(256) 15, plain steps 9), and a length cut below them raised inside
# pack_padded_sequence. So an integer input with one dimension whose
# largest value is the example's length is taken for it, and at each length
# n every sample is n long there: the padded batch at its worst, as long as
# its longest sample in every row. A mapping's labels are left alone.


def at_full_length(inputs, n, have):
    """`inputs` with each tensor of the samples' lengths (See Note [A tensor
    of each sample's length]) saying that every sample is `n` long."""
    def full(t):
        return torch.full_like(t, n) if _holds_lengths(t, have) else t

    if isinstance(inputs, dict) or (hasattr(inputs, "keys") and hasattr(inputs, "items")):
        items = {k: v if "label" in str(k) else map_tensors(v, full) for k, v in inputs.items()}
        return _same_kind(inputs, items)
    return map_tensors(inputs, full)


def _holds_lengths(t, have):
    """Whether `t` reads as each sample's length in an example `have` long."""
    if t.dim() != 1 or t.numel() == 0 or t.is_floating_point() or t.is_complex() \
            or t.dtype == torch.bool or have < 2:
        return False
    return int(t.min()) >= 0 and int(t.max()) == have


def _same_kind(mapping, items):
    """`items` as a mapping of `mapping`'s kind (a BatchEncoding) where it
    takes a dict, else a dict."""
    if type(mapping) is dict:
        return items
    try:
        return type(mapping)(items)
    except Exception:  # noqa: BLE001 (any constructor that will not take a dict)
        return items


# Note [A mask without padding]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A batch of samples of different lengths, padded to its longest, has
# padding in its attention mask; an example batch may have none (samples of
# one length, packed text). A model may build a mask only where there is
# padding: BERT's SDPA path expands it to (batch, 1, L, L), and a fit on an
# example without padding answered 17 at 64 tokens where padded batches run
# 16. So the fit per length pads the example's mask: an attention_mask (a
# mapping's, all ones; a *padding_mask all zero) gets its last position
# along seq_dim marked as padding in every sample, the batch still L wide.
# find_batch_size without lengths does the same along the mask's last
# dimension (a tiny Llama: 19 answered at 64 tokens, 18 run padded). Data
# that is never padded (packed text) is then fitted a mask below its best.


def with_padding(inputs, seq_dim):
    """`inputs` with a mask that has no padding padded at its last position:
    See Note [A mask without padding]."""
    if not (hasattr(inputs, "keys") and hasattr(inputs, "items")):
        return inputs
    items, changed = {}, False
    for k, v in inputs.items():
        d = seq_dim.get(k) if isinstance(seq_dim, dict) else seq_dim
        pad = _padding_value(k, v, d)
        if pad is not None:
            v = v.clone()
            v.narrow(d, v.shape[d] - 1, 1).fill_(pad)
            changed = True
        items[k] = v
    return _same_kind(inputs, items) if changed else inputs


def _padding_value(key, t, d):
    """The value that marks padding in `t`, a mask named `key` without any
    (seq_dim `d`); None where `t` is no such mask."""
    if not isinstance(t, torch.Tensor) or not isinstance(d, int) or isinstance(d, bool) \
            or t.dim() < 2 or not -t.dim() <= d < t.dim() or t.shape[d] < 2 \
            or t.is_floating_point() or t.is_complex():
        return None
    name = str(key)
    if name.endswith("attention_mask") and bool((t == 1).all()):
        return False if t.dtype == torch.bool else 0
    if name.endswith("padding_mask") and bool((t == 0).all()):
        return True if t.dtype == torch.bool else 1
    return None


def padded_example(inputs, seq_dim):
    """(`inputs` with a mask without padding padded, copied in host memory,
    and the note naming it; or `inputs` and None): See Note [A mask without
    padding]."""
    note = padding_note(inputs, seq_dim)
    if note is None:
        return inputs, None
    with host_memory():  # memfit's copy of the example, not the step's
        return with_padding(inputs, seq_dim), note


def padding_note(inputs, seq_dim):
    """The note naming the masks with_padding pads, or None."""
    if not (hasattr(inputs, "keys") and hasattr(inputs, "items")):
        return None
    names = [str(k) for k, v in inputs.items()
             if _padding_value(k, v, seq_dim.get(k) if isinstance(seq_dim, dict) else seq_dim)
             is not None]
    if not names:
        return None
    return (f"the example's {', '.join(names)} has no padding: fitted with each sample's last "
            f"position padded, as a batch padded to its longest sample has (a model may build "
            f"a mask only where there is padding)")


def lengths_tensor_note(inputs, have):
    """The note naming the inputs read as each sample's length, or None."""
    found = []
    parts = (inputs.items() if hasattr(inputs, "keys") and hasattr(inputs, "items")
             else [(None, inputs)])
    for k, v in parts:
        if k is not None and "label" in str(k):
            continue
        found += [(k, tuple(t.shape)) for t in tensors_in(v) if _holds_lengths(t, have)]
    if not found:
        return None
    names = ", ".join(f"{k} {s}" if k is not None else f"an input {s}" for k, s in found)
    return (f"each sample's length read from {names} (integers, the largest the example's "
            f"{have}): set to every fitted length for every sample, a padded batch at its "
            f"longest")


def _kept_at_the_examples_length(inputs, seq_dim):
    """'name (shape)' of each input a per-input seq_dim (a dict beside a
    dict batch) leaves out, with more dimensions than a per-sample label:
    a sequence that keeps the example's length at every length."""
    if not isinstance(seq_dim, dict) or not hasattr(inputs, "keys"):
        return []
    return [f"{k} {tuple(inputs[k].shape)}" for k in inputs.keys()
            if seq_dim.get(k) is None and isinstance(inputs[k], torch.Tensor)
            and inputs[k].dim() >= 2]


@dataclasses.dataclass(frozen=True)
class _Example:
    """The user's example batch, made `batch` samples `length` long."""
    inputs: Any
    target: Any
    seq_dim: Any
    length: int
    batch_dim: Any
    target_batch_dim: int

    def at(self, length, batch):
        what = "find_batch_size"
        with host_memory():  # memfit's copies: only the step's own count
            x = resize_length(self.inputs, length, self.seq_dim, self.length, what)
            x = with_padding(at_full_length(x, length, self.length), self.seq_dim)
            x = resize_batch(x, batch, self.batch_dim)
            if self.target is None:
                return x, None
            y = resize_length(self.target, length, first_batch_dim(self.seq_dim), self.length,
                              what)
            return x, resize_batch(y, batch, self.target_batch_dim)


def _checked_between(fit: LengthFit, peak_at: Callable) -> LengthFit:
    """`fit` with each gap between its measured lengths checked by one step
    at the chord's answer one token past the shorter length and half way
    (peak_at(length, batch): the step's peak, None where it ran out of
    memory). A check above the budget left backs off by its measured
    overshoot (a 32nd on an out-of-memory, which measures none) and checks
    again; the gap keeps that fraction of the chord's batch. Past a tenth,
    the gap jumps. A model that takes only some lengths (multiples of a
    patch) is checked on the measured lengths' grid instead; where no step
    runs in the gap, the gap jumps. See Note [Between measured lengths]."""
    fmt = _memfit.format_bytes
    grid = math.gcd(*fit.lengths)
    jumps, scales, notes = [], {}, []
    for lo, hi in zip(fit.lengths, fit.lengths[1:]):
        high, room = fit.fits[hi].max_batch, fit._room(lo, hi)
        for n in sorted({lo + 1, (lo + hi) // 2} - {hi}):
            for _ in range(4):
                now = dataclasses.replace(fit, scales=tuple(scales.items()))
                batch = now.at(n)
                if batch <= high:
                    break  # the longer length's own batch: fits while the peak grows
                try:
                    peak = peak_at(n, batch)
                except Exception as e:  # noqa: B902: a length the model does not take
                    if isinstance(e, torch.cuda.OutOfMemoryError):
                        raise
                    on_grid = -(-n // grid) * grid
                    if n % grid and lo < on_grid < hi:
                        n = on_grid  # the next length the measured ones share a multiple of
                        continue
                    first = (str(e).splitlines() or [""])[0]
                    scales[(lo, hi)] = 0.0
                    took = f"raised {type(e).__name__} ({first[:120]})"
                    break
                if peak is not None and peak <= room:
                    break
                took = "ran out of memory" if peak is None else f"took {fmt(peak)}"
                fewer = min(batch - 1, math.floor(batch * (room / peak if peak else 31 / 32)))
                scales[(lo, hi)] = fewer / now._chord_batch(now._views()[0], lo, hi, n,
                                                            scaled=False)
                if scales[(lo, hi)] < 0.9:
                    break
            else:
                scales[(lo, hi)] = 0.0  # four tries above the budget
            if scales.get((lo, hi), 1.0) < 0.9:
                jumps.append((lo, hi))
                del scales[(lo, hi)]
                notes.append(
                    f"between {lo} and {hi}: a step of {batch} x {n} tokens {took}, not within "
                    f"the {fmt(room)} the budget leaves: the peak jumps with the length there (a "
                    f"model that pads inside forward, or takes only some lengths?), so at() "
                    f"answers {hi}'s batch, {high}, up to {hi}; measure more lengths in between "
                    f"for larger batches")
                break
        if (lo, hi) in scales:
            notes.append(f"between {lo} and {hi}: a step at the chord's batch did not fit (the "
                         f"allocator's rounding, or a kernel that takes more at that length?): "
                         f"at() answers {1 - scales[(lo, hi)]:.1%} less there, checked")
    checked = ("between measured lengths: checked one step past each shorter length and "
               "half way" + (f"; {len(jumps)} gap(s) jump, see above" if jumps else ""))
    return dataclasses.replace(fit, jumps=tuple(jumps), scales=tuple(scales.items()),
                               notes=fit.notes + tuple(notes) + (checked,))
