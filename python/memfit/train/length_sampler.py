"""memfit.LengthBatchSampler: batches of similar length, each as large as
fits at its longest sample, for DataLoader(ds, batch_sampler=...)."""

from __future__ import annotations

import statistics
from typing import Any, Iterator, Sequence

import torch
from torch.utils.data import Sampler

from .._step.arguments import flag
from .._step.batching import count

__all__: list = []


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
#
# Across ranks (num_replicas > 1), as DistributedSampler: every rank builds
# the same epoch's batches from the same seed and epoch, and takes every
# num_replicas-th of them, from its rank. DDP needs as many steps on every
# rank; where the batches do not divide evenly, the ones with the most
# samples are cut in two (fewer samples of the same length still fit)
# until they do, so every sample still comes once per epoch across the
# ranks (drop_last=True drops the last batches instead). Each rank's
# largest predicted peak goes first on that rank.


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
    ValueError when a sample is longer than the fit's longest length.

    max_tokens: at most this many tokens per batch, padded (batch x its
    longest sample), below what fits: steady tokens per step (a sample
    longer goes alone). num_replicas, rank: each rank's share of the
    batches, as DistributedSampler (default: torch.distributed's world size
    and rank when it is initialized, else 1 and 0); the same seed on every
    rank (See Note [Batches by length]). pad_to_multiple_of: the collate
    function pads each batch to its longest sample rounded up to this
    multiple (DataCollatorWithPadding(pad_to_multiple_of=8)): each batch
    holds what fits at that padded length."""

    def __init__(self, lengths: Sequence[int], fit: Any, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, megabatch: int = 50, max_tokens: int | None = None,
                 num_replicas: int | None = None, rank: int | None = None,
                 pad_to_multiple_of: int | None = None) -> None:
        what = "LengthBatchSampler"
        if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
            raise ValueError(f"[{what}] lengths must be each sample's length, a list of ints, "
                             f"got {type(lengths).__name__} {lengths!r}")
        self.lengths = [count(n, what, f"the length of sample {i}")
                        for i, n in enumerate(lengths)]
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
        self.max_tokens = None if max_tokens is None else count(max_tokens, what, "max_tokens")
        self.pad_to_multiple_of = (1 if pad_to_multiple_of is None else
                                   count(pad_to_multiple_of, what, "pad_to_multiple_of"))
        self.num_replicas, self.rank = _replicas(num_replicas, rank, what)
        self.epoch = 0
        self._caps = {}
        for n in sorted(set(self.lengths), reverse=True):
            try:
                self.capacity(n)
            except ValueError as e:
                i = self.lengths.index(n)
                raise ValueError(f"[{what}] sample {i} is {n} long: {e}") from e
        self._cached = None

    def set_epoch(self, epoch: int) -> None:
        """The order of epoch `epoch` (shuffle=True): a new one per epoch."""
        self.epoch = int(epoch)

    def padded(self, length: int) -> int:
        """The length a batch whose longest sample is `length` is padded
        to: rounded up to pad_to_multiple_of."""
        return -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of

    def capacity(self, length: int) -> int:
        """How many samples a batch whose longest sample is `length` holds:
        what fits at its padded length, and no more than max_tokens // that
        length (at least one)."""
        if length not in self._caps:
            padded = self.padded(length)
            cap = count(self.fit.at(padded), "LengthBatchSampler", f"fit.at({padded})")
            if self.max_tokens is not None:
                cap = max(1, min(cap, self.max_tokens // padded))
            self._caps[length] = cap
        return self._caps[length]

    def predicted_peak_bytes(self, batch: list[int]) -> int:
        """The predicted peak of `batch` padded to its longest sample; its
        padded tokens when the fit predicts no bytes."""
        longest = self.padded(max(self.lengths[i] for i in batch))
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
        """This epoch's batches for this rank, in the order they are given."""
        if self._cached is not None and self._cached[0] == self.epoch:
            return self._cached[1]
        out = self._all_batches()
        if self.num_replicas > 1:
            out = self._share(out)
        self._cached = (self.epoch, out)
        return out

    def _largest_first(self, batches):
        if batches:
            peaks = [self.predicted_peak_bytes(b) for b in batches]
            first = max(range(len(batches)), key=peaks.__getitem__)
            batches.insert(0, batches.pop(first))
        return batches

    def _share(self, batches):
        """This rank's batches of the epoch's: See Note [Batches by length]."""
        r = self.num_replicas
        if self.drop_last:
            batches = batches[:len(batches) - len(batches) % r]
        else:
            if sum(len(b) for b in batches) < r:
                raise ValueError(f"[LengthBatchSampler] {r} ranks need a sample each, and the "
                                 f"dataset has {sum(len(b) for b in batches)}")
            while len(batches) % r:
                i = max(range(len(batches)), key=lambda j: len(batches[j]))
                b = batches[i]
                if len(b) < 2:
                    raise ValueError(
                        f"[LengthBatchSampler] {len(batches)} batches of one sample each do not "
                        f"share evenly over {r} ranks: pass drop_last=True")
                batches[i:i + 1] = [b[:(len(b) + 1) // 2], b[(len(b) + 1) // 2:]]
        return self._largest_first(batches[self.rank::r])

    def _all_batches(self):
        """The epoch's batches over every rank: the same on each."""
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
        return self._largest_first(out)

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.batches()

    def __len__(self) -> int:
        return len(self.batches())

    def __repr__(self):
        ranks = (f", rank {self.rank} of {self.num_replicas}" if self.num_replicas > 1 else "")
        return (f"LengthBatchSampler({len(self.lengths)} samples, {len(self)} batches{ranks}, "
                f"shuffle={self.shuffle}, seed={self.seed}, epoch={self.epoch}, "
                f"drop_last={self.drop_last})")


def _replicas(num_replicas, rank, what):
    """(num_replicas, rank): given, or torch.distributed's, or (1, 0)."""
    dist = torch.distributed
    on = dist.is_available() and dist.is_initialized()
    if num_replicas is None:
        num_replicas = dist.get_world_size() if on else 1
    if rank is None:
        rank = dist.get_rank() if on else 0
    num_replicas = count(num_replicas, what, "num_replicas")
    rank = count(rank, what, "rank", minimum=0)
    if rank >= num_replicas:
        raise ValueError(f"[{what}] rank {rank} is not below num_replicas={num_replicas}")
    return num_replicas, rank
