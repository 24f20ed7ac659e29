"""Reading a value out of a meta tensor during a meta-mode step.

Note [Data-dependent reads on the meta device]: a meta tensor has a shape
and no values, so `.item()`, `bool(t)` and `if t.all():` have nothing to
read; torch raises "Tensor.item() cannot be called on meta tensors". Models
do it for checks that pick a faster path: transformers asks, on every
forward, whether all sequences are unpacked (`(mask[:, -1] == 0).all()`)
before it builds its attention mask. While meta mode runs the step, such a
read of a boolean answers True, the case every checked element holds (an
unpacked batch, a mask of ones), and the report's notes name each place it
happened, so the figures say which path they measured. A read of a number
(a length, a count) has no safe answer: it raises, one line naming where,
and meta mode falls back to the CPU as for a missing meta kernel.
"""

import contextlib
import os
import traceback

import torch

_TORCH_DIR = os.path.dirname(torch.__file__)


def _caller():
    """'file:line' of the innermost frame outside torch, or '?'."""
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith(_TORCH_DIR) and frame.filename != __file__:
            return f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return "?"


class MetaReads:
    """Where boolean reads of meta tensors were answered True (file:line,
    in the order first seen), while answering() is active."""

    def __init__(self):
        self.sites = []

    @contextlib.contextmanager
    def answering(self):
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("_local_scalar_dense", self._read, "Meta")
        try:
            yield self
        finally:
            lib._destroy()

    def _read(self, t):
        site = _caller()
        if t.dtype != torch.bool:
            raise RuntimeError(
                f"[profile] the step reads a {t.dtype} value of a meta tensor at {site} "
                f"(.item(), int(), a data-dependent size): the meta device has shapes "
                f"without values; move that read out of the step, or profile with real "
                f"tensors (mode='cpu')")
        if site not in self.sites:
            self.sites.append(site)
        return True

    def note(self):
        """The report's note, or None when nothing was read."""
        if not self.sites:
            return None
        shown = ", ".join(self.sites[:3]) + (" ..." if len(self.sites) > 3 else "")
        return (f"meta tensors have no values: {len(self.sites)} boolean check(s) of the "
                f"step answered True (every element holds) at {shown}; "
                f"see Note [Data-dependent reads on the meta device]")
