"""A meta-mode step for a CPU target, checked once against the CPU's own
step. See Note [Meta mode checked against the CPU's kernels]."""

import contextlib
import contextvars

from .._native import native as _memfit

__all__: list = []

# Note [Meta mode checked against the CPU's kernels]
# A meta kernel allocates only its outputs (Note [Meta kernels allocate only
# their outputs]); the CPU's kernels take scratch of their own inside the
# op, and some ops run other kernels on the CPU altogether: oneDNN's LSTM
# and convolutions (Note [What meta mode cannot size in an RNN]), and
# linear algebra: an orthogonal parametrization (matrix_exp of a 256 x 256
# weight) peaked at 3.99 MB on meta and 16.31 MB on the CPU at batch 8, and
# mode="meta" answered a batch of 1202 where plain steps ran out at 1. A
# list of such ops is never complete. So for a CPU target, where the model
# and inputs are real and the host has the room (HEADROOM meta peaks), the
# first meta recording is checked by one CPU step of the same batch: where
# the CPU's peak is higher by more than CHECK_TOLERANCE, every batch is
# rehearsed on the CPU (exact for a CPU target), and the notes give both
# peaks; else meta's figures stand, checked there, the note giving what the
# CPU took more (the MLP's CPU step allocates a few bytes meta does not;
# resnet18's 0.6%). For a card meta's figures stand: a card's kernels are
# sized on the card.

CHECK_TOLERANCE = 0.01  # of meta's peak: the CPU's own step may take this much more
#
# advise's cheap rows are recorded on meta to rank settings fast and the plan
# it picks is recorded on the CPU (Note [Rows advise predicts]): a check per
# row would make each row a CPU step, so those recordings are unchecked.

_UNCHECKED = contextvars.ContextVar("memfit_meta_unchecked", default=False)


@contextlib.contextmanager
def unchecked():
    """Meta recordings inside are not checked by a CPU step: for a caller
    that records what it picks on the CPU itself."""
    token = _UNCHECKED.set(True)
    try:
        yield
    finally:
        _UNCHECKED.reset(token)


def is_checked() -> bool:
    """Whether a meta recording for a CPU target is checked here."""
    return not _UNCHECKED.get()


def cpu_kernels_note(batch: int, meta_peak: int, cpu_peak: int) -> str:
    """The note of a meta step rehearsed on the CPU because the CPU's own
    kernels took more."""
    fmt = _memfit.format_bytes
    return (f"mode='meta' rehearsed this step on the CPU: at batch {batch} the CPU's own step "
            f"peaked at {fmt(cpu_peak)}, meta's at {fmt(meta_peak)} (kernels that take scratch "
            f"or run otherwise on the CPU, which meta does not size); see Note [Meta mode "
            f"checked against the CPU's kernels]")


def checked_note(batch: int, meta_peak: int, cpu_peak: int) -> str:
    """The note of a meta step whose peak one CPU step came within
    CHECK_TOLERANCE of."""
    more = cpu_peak - meta_peak
    said = (f"{_memfit.format_bytes(more)} above meta's {_memfit.format_bytes(meta_peak)}"
            if more > 0 else f"not above meta's {_memfit.format_bytes(meta_peak)}")
    return f"meta's figures checked against one CPU step at batch {batch}: its peak {said}"
