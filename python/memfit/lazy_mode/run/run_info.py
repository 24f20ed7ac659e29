"""LazyRun: how memfit ran the last lazy computation (memfit.last_lazy_run()).
"""

from __future__ import annotations

from .chunking import MARGIN, plan

__all__ = ["LazyRun", "last_run"]


_last_run = None


class LazyRun:
    """How memfit ran the last lazy computation (memfit.last_lazy_run()).

    kind: "backward", "read" or "eager"; batch: B; chunks: [(start, size)]
    of the chunks that completed, in order; ooms: OOMs recovered from;
    chunk_limit: the planned largest chunk (None: no limit known);
    bytes_per_sample, fixed_bytes: the fitted M(c) = fixed + per_sample*c
    (None when not measured); available_bytes: memory available when
    planning; margin: fraction kept free; measured: True if measured now
    (False: taken from the cache); whole: why it ran in one chunk, or None.
    """

    def __init__(self, kind: str, batch: int) -> None:
        self.kind = kind
        self.batch = batch
        self.chunks = []
        self.ooms = 0
        self.chunk_limit = None
        self.bytes_per_sample = None
        self.fixed_bytes = None
        self.available_bytes = None
        self.margin = MARGIN
        self.measured = False
        self.whole = None
        self._entry = None
        self._reserve = 0
        self._extra = 0.0

    def keep_fit(self, entry: dict, reserve: int, extra_per_sample: float) -> None:
        """Keep the memory fit this run's chunk size came from, for
        limit_for()."""
        self._entry, self._reserve, self._extra = entry, reserve, extra_per_sample

    def limit_for(self, available_bytes: int) -> int | None:
        """The chunk limit memfit would choose for the same computation with
        `available_bytes` free (from the fit measured for this run; None if
        nothing was measured)."""
        e = self._entry
        if e is None:
            return None
        return plan(e, self.batch, available_bytes, self._reserve, self._extra)[0]

    def __repr__(self):
        sizes = [s for _, s in self.chunks]
        return (
            f"LazyRun(kind={self.kind!r}, batch={self.batch}, chunks={len(sizes)} {sizes}, "
            f"ooms={self.ooms}, chunk_limit={self.chunk_limit}, "
            f"bytes_per_sample={self.bytes_per_sample}, fixed_bytes={self.fixed_bytes}, "
            f"available_bytes={self.available_bytes}, whole={self.whole!r})"
        )


def last_run():
    """The LazyRun of the last lazy computation, or None."""
    return _last_run


def set_last_run(info):
    global _last_run
    _last_run = info
