"""memfit.LengthBatchSampler: batches of similar length, each as large as
fits at its longest sample, for DataLoader(ds, batch_sampler=...)."""

from __future__ import annotations

import statistics
from typing import Any, Iterator, Sequence

import torch
from torch.utils.data import Sampler

from .._step.arguments import flag
from .._step.batching import count

__all__ = ["LengthBatchSampler"]


# Note [Batches by length]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# As Hugging Face's group_by_length: the samples are shuffled (seed + epoch),
# cut into megabatches of about `megabatch` batches each, and each megabatch
# is sorted by length, longest first. A batch starts at its longest sample,
# L, and takes the next ones (no longer) until it holds fit.at(L): padded to
# L, it fits. Each megabatch leaves one batch short; those samples are pooled,
# sorted and batched again, so at most one batch of the epoch is short (the
# one drop_last drops). The batches are then shuffled, and the one with the
# largest predicted peak goes first: if anything does not fit, the first
# step says so, not one an hour in.


class LengthBatchSampler(Sampler[list[int]]):
    """Batches of dataset indices grouped by length, each fitting the
    budget when padded to its longest sample.

        fit = memfit.find_batch_size(model, x, y, seq_dim=1, lengths=[64, 256, 1024])
        sampler = memfit.LengthBatchSampler([len(s) for s in ds], fit)
        loader = DataLoader(ds, batch_sampler=sampler, collate_fn=pad)

    lengths: each sample's length (tokens), in dataset order. fit: a
    LengthFit (find_batch_size(..., seq_dim=, lengths=)), or anything with
    at(length) -> the largest batch at that length and, optionally,
    predict_peak_bytes(batch, length). shuffle: a new order each epoch
    (set_epoch(e), as DistributedSampler), the same for the same seed and
    epoch; False: dataset order, still grouped and largest first. drop_last:
    drop the one batch that holds fewer samples than fit allows. megabatch:
    batches per sorted group (see Note [Batches by length]): larger pads
    less, smaller mixes more.

    Every sample comes exactly once per epoch (drop_last=False). Raises
    ValueError when a sample is longer than the fit's longest length."""

    def __init__(self, lengths: Sequence[int], fit: Any, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, megabatch: int = 50) -> None:
        what = "LengthBatchSampler"
        self.lengths = [count(n, what, "each length") for n in lengths]
        if not self.lengths:
            raise ValueError(f"[{what}] lengths is empty: give each sample's length")
        if not callable(getattr(fit, "at", None)):
            raise ValueError(f"[{what}] fit must have at(length) -> batch (a LengthFit from "
                             f"find_batch_size(..., seq_dim=, lengths=)), got "
                             f"{type(fit).__name__}")
        self.fit = fit
        self.shuffle = flag(shuffle, what, "shuffle")
        self.drop_last = flag(drop_last, what, "drop_last")
        self.seed = int(seed)
        self.megabatch = count(megabatch, what, "megabatch")
        self.epoch = 0
        self._caps = {}
        for n in sorted(set(self.lengths), reverse=True):
            try:
                self._caps[n] = count(fit.at(n), what, f"fit.at({n})")
            except ValueError as e:
                i = self.lengths.index(n)
                raise ValueError(f"[{what}] sample {i} is {n} long: {e}") from e
        self._cached = None

    def set_epoch(self, epoch: int) -> None:
        """The order of epoch `epoch` (shuffle=True): a new one per epoch."""
        self.epoch = int(epoch)

    def capacity(self, length: int) -> int:
        """How many samples padded to `length` a batch holds."""
        if length not in self._caps:
            self._caps[length] = count(self.fit.at(length), "LengthBatchSampler",
                                       f"fit.at({length})")
        return self._caps[length]

    def predicted_peak_bytes(self, batch: list[int]) -> int:
        """The predicted peak of `batch` padded to its longest sample; its
        padded tokens when the fit predicts no bytes."""
        longest = max(self.lengths[i] for i in batch)
        predict = getattr(self.fit, "predict_peak_bytes", None)
        if predict is None:
            return len(batch) * longest
        return predict(len(batch), longest)

    def _fill(self, indices):
        """`indices` (longest first) cut into batches from the front; the
        last may be short: (batches, short or None)."""
        batches, i = [], 0
        while i < len(indices):
            cap = self.capacity(self.lengths[indices[i]])
            batches.append(indices[i:i + cap])
            i += cap
        if batches and len(batches[-1]) < self.capacity(self.lengths[batches[-1][0]]):
            return batches[:-1], batches[-1]
        return batches, None

    def batches(self) -> list[list[int]]:
        """This epoch's batches, in the order they are given."""
        if self._cached is not None and self._cached[0] == self.epoch:
            return self._cached[1]
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        n = len(self.lengths)
        order = torch.randperm(n, generator=g).tolist() if self.shuffle else list(range(n))
        size = self.megabatch * self.capacity(int(statistics.median_low(self.lengths)))

        def longest_first(ids):  # stable: equal lengths keep the shuffled order
            return sorted(ids, key=lambda i: -self.lengths[i])

        out, rest = [], []
        for start in range(0, n, size):
            full, short = self._fill(longest_first(order[start:start + size]))
            out += full
            rest += short or []
        full, short = self._fill(longest_first(rest))
        out += full
        if short and not self.drop_last:
            out.append(short)
        if self.shuffle:
            out = [out[i] for i in torch.randperm(len(out), generator=g).tolist()]
        if out:
            peaks = [self.predicted_peak_bytes(b) for b in out]
            first = max(range(len(out)), key=peaks.__getitem__)
            out.insert(0, out.pop(first))
        self._cached = (self.epoch, out)
        return out

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.batches()

    def __len__(self) -> int:
        return len(self.batches())

    def __repr__(self):
        return (f"LengthBatchSampler({len(self.lengths)} samples, {len(self)} batches, "
                f"shuffle={self.shuffle}, seed={self.seed}, epoch={self.epoch}, "
                f"drop_last={self.drop_last})")
