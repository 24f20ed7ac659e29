"""A report's probes of other batches (prediction(), predict_peak_bytes(),
peak_model()): the core's probe_toward, each step measured once, and past a
step whose small batches run other kernels than its large ones."""

from __future__ import annotations

from typing import Callable

from .._native import native as _memfit

__all__: list = []

# Note [Probes past a step's odd small batches]
# The core's probes (Note [Probing toward the answer], batch_search.h) grow
# only while the last probe missed its line: when the first probes already
# disagree, they stop at 8x, and the model, fitted across the odd batch,
# predicted under every batch. A CNN with BatchNorm profiled at batch 4: its
# step at batch 1 runs other CPU kernels (319 KiB, 26% above the line of
# batches 2 to 64, exact from there), and probes 1, 2, 4 predicted 11% under
# plain steps at 16 and 17, and 7.5% under batch 1's own measured step; a
# tiny GPT-2 0.8% under at 1 and 7. So a step not affine over its probes is
# probed again without its smallest probe and with the next doubling, until
# the line holds or the next probe would be the batch asked. Probes already
# grown past such a batch (64 to 256, past a kernel's switch at 48) are
# first checked alone: the core calls a step not affine once any check
# missed. A batch the line cannot be trusted at (not affine, or below the
# smallest probe, where the odd small batches are) is measured itself,
# beside half of it: the prediction there is its own step's peak. Each step
# is measured once.


class Probing:
    """The probes one report runs: measure(batch) -> (C++ report,
    timeline) or None (out of memory), each batch measured once."""

    def __init__(self, measure: Callable, first: list, limit: int) -> None:
        self._measure, self._first, self._limit = measure, first, limit
        self._measured: dict = {}
        self.grown = None  # grown toward the largest batch asked so far
        self._at: dict = {}  # batch -> the probes measured at that batch

    def _step(self, batch):
        if batch not in self._measured:
            self._measured[batch] = self._measure(batch)
        return self._measured[batch]

    def _probe(self, batch, first):
        return _memfit.probe_toward(self._step, batch, first, self._limit)

    def grown_toward(self, batch: int):
        """The probes grown toward `batch` (and past a step's odd small
        batches), kept for later calls: the peak model over all batches."""
        grown = self.grown
        if grown is None or grown.largest_probe() * 8 < batch or \
                (not grown.affine and batch > 2 * grown.largest_probe()):
            self.grown = grown = self._past_odd_batches(batch)
        return grown

    def toward(self, batch: int):
        """The ProbedModel to predict `batch` from: See Note [Probes past a
        step's odd small batches]."""
        grown = self.grown_toward(batch)
        fitted = list(grown.model.probe_batches)
        if not fitted or (grown.affine and batch >= min(fitted)):
            return grown
        if not grown.affine and batch > 2 * grown.largest_probe():
            return grown  # stopped by the memory limit: flagged not affine
        if batch not in self._at:
            self._at[batch] = self._at_batch(batch, grown)
        return self._at[batch]

    def _past_odd_batches(self, batch):
        """Probes toward `batch`; while they are not affine, the fitted
        probes checked alone (steps measured already), then again without
        the smallest and with the next doubling."""
        first = list(self._first)
        probed = self._probe(batch, first)
        while not probed.affine:
            fitted, largest = sorted(probed.model.probe_batches), probed.largest_probe()
            following = 2 * largest
            if len(fitted) == 3 and fitted != first:
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
