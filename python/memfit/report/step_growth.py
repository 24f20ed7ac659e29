"""What a report says of a step that keeps memory past its end: See Note [A
step whose memory grows step after step]."""

from __future__ import annotations

from .._native import native as _memfit

__all__: list = []

# Note [A step whose memory grows step after step]
# memfit records two iterations of the loop. A step that keeps something of
# each iteration alive past its end (features or losses appended to a list
# as tensors, an output kept in a history, a graph carried into the next
# step) ends each iteration with more alive than the one before, and each
# step's peak is higher than the last: a fit verified on the two steps ran
# out of memory in the user's loop later (a B x 512 feature kept per step:
# 752 "verified"; plain steps ran 753 for 2 steps, 630 for 3, 423 for 6),
# and nothing said so. The growth is read off the report: what was alive
# after the last iteration less what was alive after the one before. A
# steady loop ends its iterations equal to the byte (the optimizer's state
# and the .grad it keeps are made in the first), so any growth is said,
# with the batch it was measured at.


def growth_bytes(phases: list) -> int:
    """The bytes alive after the last iteration of `phases` (a Report's)
    less those after the latest one before it that ended in the same phase
    (with accumulated micro-batches, the one that stepped the optimizer
    too); 0 where there is none."""
    ends = {}
    for p in phases:  # in order: each iteration's last phase is its end
        ends[p["iteration"]] = (p["name"], p["live_bytes_after"])
    order = sorted(ends)
    if not order:
        return 0
    name, live = ends[order[-1]]
    before = [ends[i][1] for i in order[:-1] if ends[i][0] == name]
    return live - before[-1] if before else 0


def growth_note(phases: list, batch: int) -> str | None:
    """The note on a step of `batch` samples whose memory grows from one
    iteration to the next (See Note [A step whose memory grows step after
    step]), or None."""
    grown = growth_bytes(phases)
    if grown <= 0:
        return None
    return (f"memory grows step after step: {_memfit.format_bytes(grown)} more was alive after "
            f"the last step recorded than after the one before, at batch {batch}: kept past "
            f"the step's end (tensors appended to a list, a graph carried into the next step), "
            f"it raises each step's peak by as much, so a batch that fits the steps recorded "
            f"runs out of memory later in a longer loop; keep .item() or .detach().cpu() of "
            f"what you log (memfit.doctor finds where)")
