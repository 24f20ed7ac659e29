"""The chunk loop: samples [0, B) in the chunks of the core's ChunkSchedule
(balanced, an out-of-memory chunk halved and its samples redone), the
gradients each chunk still owes kept by its ChunkCoverage. What is lazy's
own: running a chunk, putting buffers back, refusing to redo an in-place
write.
"""

import traceback

import torch

from ..._native import ChunkCoverage, ChunkSchedule, allocator_figures, budget
from ..._step.oom_explain import explain, live_memory, phase_of
from ..graph.errors import LazyError, OutOfMemoryError
from .buffers import BufferSnapshot
from .grad_bookkeeping import grad_snapshot, changed_grads
from .memory import batch_note

__all__: list = []


def _explained(e):
    """What filled the device when `e` was raised, and the advice for that
    cause, in a sentence (the core's, as the simulated device's own OOM),
    read while e's frames still hold what the chunk had allocated."""
    device = "meta" if "simulated meta device" in str(e) else "cpu"
    if budget(device) is None:
        return ""  # a real card's: memfit tracks none of its memory
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    phase = phase_of(tb.tb_frame) if tb is not None else ""
    _, _, advice, what_fills, words = explain("lazy", "", phase, live_memory(device),
                                              budget(device))
    return f"it ran out in {words}, with {what_fills} on the device. {advice}"


def _oom(e_text, size, what, data, info, explained=""):
    note = batch_note(data, info) if data is not None else ""
    figures = allocator_figures(e_text) or e_text
    where = (f" even {size} sample(s) at a time" if size < info.batch else
             " with the whole batch at once, as eager PyTorch runs it")
    head = f"memfit.lazy: {what} does not fit{where}: "
    return OutOfMemoryError(
        head + (f"{explained} {figures}" if explained else e_text)
        + (f"\n{note}" if note else "")
    )


def drive_chunks(B, limit, attempt, commit, info, cands=None, can_split=True, what="the step",
                 inputs=None, buffers=()):
    """Run samples [0, B) in chunks of at most `limit` (None: B), halving on
    OOM (see Note [How chunks are scheduled] in core/model/chunk_schedule.h).

    attempt(start, size, only) -> result; only is None (all gradients) or the
    list of tensors whose gradients are still owed for these samples (see
    Note [Why a retried chunk never counts twice] in core/model/chunk_coverage.h).
    `cands`: the tensors whose .grad a chunk may accumulate into (None: no
    bookkeeping, a redo computes every gradient).
    commit(start, size, result) keeps a completed chunk's values. `inputs`:
    the BatchData the chunks read; a chunk that ran out of memory after
    writing into its resident tensors (the chunks are views of them) is not
    redone (the write would count twice). `buffers` (from written_buffers): put back as they were before
    an attempt that ran out of memory (see Note [A failed chunk leaves no
    trace] in buffers.py). Returns the chunk size later runs should start from."""
    kept = BufferSnapshot(buffers) if buffers else None
    resident = inputs.resident if inputs is not None else ()
    schedule = ChunkSchedule(B, 0 if limit is None else int(max(1, min(limit, B))),
                             can_split)
    coverage = ChunkCoverage(len(cands)) if cands is not None else None
    while not schedule.done:
        chunk = schedule.next()
        start, size = chunk.start, chunk.size
        owed = coverage.owed(chunk) if coverage is not None else None
        owed_tensors = [cands[i] for i in owed] if owed is not None else None
        only = None if owed is None or len(owed) == len(cands) else owed_tensors
        snap = grad_snapshot(owed_tensors) if owed is not None else None
        versions = [t._version for t in resident]
        if kept is not None:
            kept.take()
        failed = None
        go_on = True
        try:
            result = attempt(start, size, only)
        except OutOfMemoryError as e:
            failed = str(e).splitlines()[0] if str(e) else "out of memory"
            go_on = schedule.failed()
            explained = "" if go_on else _explained(e)
            # Drop every reference the failed chunk held: the frames in the
            # traceback keep its tensors alive until cleared.
            traceback.clear_frames(e.__traceback__)
            e.__traceback__ = None
        if failed is None:
            commit(start, size, result)
            result = None
            info.chunks.append((start, size))
            if coverage is not None:
                coverage.add(chunk, owed)
            schedule.succeeded()
            continue
        info.ooms += 1
        if kept is not None:
            kept.restore()
        if not go_on:
            raise _oom(failed, size, what, inputs, info, explained)
        if any(t._version != v for t, v in zip(resident, versions)):
            raise LazyError(
                f"memfit.lazy: samples {start}..{start + size - 1} of {what} ran out of memory "
                f"after the computation wrote into a lazy input in place (its version "
                f"changed); redoing them would apply that write twice. Write out of place "
                f"(x = x * 2, not x.mul_(2)) in the modules the lazy tensors go through"
            )
        if coverage is not None:
            # What the failed backward accumulated stays; the redo owes the rest.
            coverage.add(chunk, [owed[j] for j in changed_grads(owed_tensors, snap)])
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return schedule.size
