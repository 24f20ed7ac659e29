"""A report's probes of other batches (prediction(), predict_peak_bytes(),
peak_model()): the core's probe_toward, each step measured once, and past a
step whose small batches run other kernels than its large ones."""

from __future__ import annotations

from typing import Callable

from .._native import native as _memfit

__all__: list = []

TOLERANCE = 0.005  # the core's ProbePlan.tolerance: a miss still called affine

# Note [Probes past a step's odd small batches]
# The core's probes (Note [Probing toward the answer], batch_search.h) grow
# while the last probe missed its line; they stopped at 8x where the first
# probes already disagreed (since grown past them), and the model, fitted
# across the odd batch, predicted under every batch; and the core calls a
# step not affine for good once any check missed. A CNN with BatchNorm profiled at batch 4: its
# step at batch 1 runs other CPU kernels (319 KiB, 26% above the line of
# batches 2 to 64, exact from there), and probes 1, 2, 4 predicted 11% under
# plain steps at 16 and 17, and 7.5% under batch 1's own measured step; a
# tiny GPT-2 0.8% under at 1 and 7. So a step not affine over its probes is
# probed again without its smallest probe and with the next doubling, until
# the line holds or the next probe would be the batch asked. Probes already
# grown past such a batch (64 to 256, past a kernel's switch at 48) are
# first checked alone: the core calls a step not affine once any check
# missed. Powers of two can agree where no other batch does: an LSTM's CPU
# step, whose peak jitters with the batch (+185 KiB then +238 KiB a sample),
# lay within 0.1% of the line of probes 2, 4, 8 that was 1% under batch 7,
# 2% under 13 and 64; so the line must also hold at an odd batch between
# its two largest probes. A batch the line cannot be trusted at (not
# affine, or below the smallest probe, where the odd small batches are) is
# measured itself, beside half of it: the prediction there is its own
# step's peak. Each step is measured once.


class Probing:
    """The probes one report runs: measure(batch) -> (C++ report,
    timeline) or None (out of memory), each batch measured once."""

    def __init__(self, measure: Callable, first: list, limit: int) -> None:
        self._measure, self._first, self._limit = measure, first, limit
        self._measured: dict = {}
        self.grown = None  # grown toward the largest batch asked so far
        self._missed = None  # the odd batch's miss off the grown line, if over
        self._at: dict = {}  # batch -> the probes measured at that batch

    def _step(self, batch):
        if batch not in self._measured:
            self._measured[batch] = self._measure(batch)
        return self._measured[batch]

    def _probe(self, batch, first):
        return _memfit.probe_toward(self._step, batch, first, self._limit)

    def _odd_miss(self, probed):
        """(batch, miss) of the line at an odd batch between the two largest
        fitted probes, or None where it holds there (or has no such batch)."""
        fitted = sorted(probed.model.probe_batches)
        odd = (fitted[-2] + fitted[-1]) // 2 | 1 if len(fitted) >= 2 else 0
        measured = self._step(odd) if len(fitted) >= 2 and fitted[-2] < odd < fitted[-1] \
            else None
        if measured is None:  # no batch between, or it ran out of memory
            return None
        peak = measured[0].peak_bytes
        miss = abs(peak - probed.model.predict(odd)) / max(peak, 1)
        return (odd, miss) if miss > TOLERANCE else None

    def _holds(self, probed):
        return probed.affine and bool(probed.model.probe_batches) and \
            self._odd_miss(probed) is None

    def grown_toward(self, batch: int):
        """The probes grown toward `batch` (and past a step's odd small
        batches), kept for later calls: the peak model over all batches."""
        grown = self.grown
        holds = grown is not None and self._missed is None and grown.affine
        if grown is None or grown.largest_probe() * 8 < batch or \
                (not holds and batch > 2 * grown.largest_probe()):
            self.grown = grown = self._past_odd_batches(batch)
            self._missed = self._odd_miss(grown) if grown.model.probe_batches else None
        return grown

    def notes(self, probed) -> list:
        """What the report says of `probed` where its line may not hold."""
        said = list(probed.notes) if not probed.affine else []
        return said + self.missed_notes(probed)

    def missed_notes(self, probed) -> list:
        """The line of `probed` missing a batch between its probes, in a
        line, or none: what its held-out check cannot say, so a prediction
        from it says it too (PredictionCertainty.notes)."""
        if probed is not self.grown or self._missed is None:
            return []
        odd, miss = self._missed
        return [f"the line of the probes at {list(probed.model.probe_batches)} missed batch "
                f"{odd}'s step by {100 * miss:.2f}%, their held-out check aside: predictions "
                f"from them may be off by that or more"]

    def toward(self, batch: int):
        """The ProbedModel to predict `batch` from: See Note [Probes past a
        step's odd small batches]."""
        grown = self.grown_toward(batch)
        fitted = list(grown.model.probe_batches)
        holds = grown.affine and self._missed is None
        if not fitted or (holds and batch >= min(fitted)):
            return grown
        if not holds and batch > 2 * grown.largest_probe():
            return grown  # stopped by the memory limit: its notes say so
        if batch not in self._at:
            self._at[batch] = self._at_batch(batch, grown)
        return self._at[batch]

    def _past_odd_batches(self, batch):
        """Probes toward `batch`; while their line does not hold, the fitted
        probes checked alone (steps measured already), then again without
        the smallest and with the next doubling."""
        first = list(self._first)
        probed = self._probe(batch, first)
        while not self._holds(probed):
            fitted, largest = sorted(probed.model.probe_batches), probed.largest_probe()
            following = 2 * largest
            if len(fitted) == 3 and fitted != first and not probed.affine:
                first = fitted
            elif len(fitted) < 2 or following >= batch or \
                    probed.model.predict(following) > self._limit:
                break
            else:
                first = fitted[1:] + [following]
            again = self._probe(batch, first)
            if again.largest_probe() < max(first):  # the next doubling ran out of memory
                break
            probed = again
        return probed

    def _at_batch(self, batch, grown):
        """The probes at `batch` itself and half of it, or `grown` where that
        step would pass the memory limit or ran out of memory."""
        if grown.model.predict(batch) > self._limit:
            return grown
        probed = self._probe(batch, [1, 2] if batch == 1 else [batch // 2, batch])
        return probed if batch in probed.model.probe_batches else grown
