"""The chunk loop: samples [0, B) in balanced chunks, an out-of-memory chunk
halved and redone.
"""

import collections
import traceback

import torch

from ..lazy_graph.errors import LazyError, OutOfMemoryError
from .buffers import BufferSnapshot
from .grad_bookkeeping import grad_snapshot, unchanged_grads
from .memory import batch_note


def _balanced(remaining, c):
    n = -(-remaining // c)
    return -(-remaining // n)


def _oom(e_text, size, what, data, info):
    note = batch_note(data, info) if data is not None else ""
    return OutOfMemoryError(
        f"memfit.lazy: {what} does not fit even {size} sample(s) at a time: {e_text}"
        + (f"\n{note}" if note else "")
    )


def drive_chunks(B, limit, attempt, commit, info, cands=None, can_split=True, what="the step",
           inputs=None, buffers=()):
    """Run samples [0, B) in chunks of at most `limit`, halving on OOM.

    attempt(start, size, only) -> result; only is None (all gradients) or the
    list of tensors whose gradients are still owed for these samples.
    commit(start, size, result) keeps a completed chunk's values. `inputs`:
    the BatchData the chunks read; a chunk that ran out of memory after
    writing into its resident tensors (the chunks are views of them) is not
    redone (the write would count twice). `buffers` (from written_buffers): put back as they were before
    an attempt that ran out of memory (see Note [A failed chunk leaves no
    trace] in buffers.py)."""
    kept = BufferSnapshot(buffers) if buffers else None
    resident = inputs.resident if inputs is not None else ()
    pending = collections.deque()
    pos = 0
    c = B if limit is None else max(1, min(limit, B))
    while pending or pos < B:
        if pending:
            start, size, only = pending.popleft()
        else:
            size = _balanced(B - pos, c)
            start, only = pos, None
            pos += size
        snap = grad_snapshot(cands) if cands is not None else None
        versions = [t._version for t in resident]
        if kept is not None:
            kept.take()
        failed = None
        try:
            result = attempt(start, size, only)
        except OutOfMemoryError as e:
            # Drop every reference the failed chunk held: the frames in the
            # traceback keep its tensors alive until cleared.
            failed = str(e).splitlines()[0] if str(e) else "out of memory"
            traceback.clear_frames(e.__traceback__)
            e.__traceback__ = None
        if failed is None:
            commit(start, size, result)
            result = None
            info.chunks.append((start, size))
            continue
        info.ooms += 1
        if kept is not None:
            kept.restore()
        if size <= 1 or not can_split:
            raise _oom(failed, size, what, inputs, info)
        if any(t._version != v for t, v in zip(resident, versions)):
            raise LazyError(
                f"memfit.lazy: samples {start}..{start + size - 1} of {what} ran out of memory "
                f"after the computation wrote into a lazy input in place (its version "
                f"changed); redoing them would apply that write twice. Write out of place "
                f"(x = x * 2, not x.mul_(2)) in the modules the lazy tensors go through"
            )
        if snap is not None:
            owed = unchanged_grads(cands, snap, only if only is not None else cands)
        else:
            owed = only
        half = size // 2
        pending.appendleft((start + half, size - half, owed))
        pending.appendleft((start, half, owed))
        c = max(1, min(c, half))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return c
