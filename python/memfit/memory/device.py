"""The simulated device: a memory budget enforced on CPU allocations, and
the host memory beside it."""

from __future__ import annotations

import contextlib
from typing import ContextManager

from .._native import native as _memfit
from .._step import oom_explain
from .._step.device import host_memory, to_bytes
from .._step.hints import Size

__all__ = ["host_memory", "simulated_device", "to_bytes"]


@contextlib.contextmanager
def simulated_device(budget: Size, device: str = "cpu") -> ContextManager[None]:
    """Cap tracked memory on `device` ("cpu" or "meta") at `budget`.

    Inside the block, an allocation that would take the memory allocated since
    tracking began past the budget raises torch.cuda.OutOfMemoryError, exactly
    as a full GPU does, so "does this fit a 16 GiB card?" can be rehearsed on
    a laptop. `budget` is an int of bytes or a string: "16GiB", "512MiB",
    "1.5GiB", "1048576" (binary units only: "16GB" is ambiguous and refused).

    Only memory allocated while memfit tracks is counted: create the model and
    data inside the block (or inside memfit.track()) to have them count.
    Nested blocks apply the smallest budget.

    The error names what fills the device (parameters, gradients, optimizer
    state, the rest: activations in the forward and backward) and the advice
    for that cause, then the allocator's figures: an OOM in Adam's first
    step says a smaller batch cannot help. See Note [What fills the
    simulated device] (tracking.cpp).
    """
    # Its OOMs say what fills it: see Note [What fills the simulated device].
    oom_explain.install()
    handle = _memfit.SimulatedDevice(to_bytes(budget, "simulated_device"), device)
    try:
        yield handle
    finally:
        del handle  # destroys the C++ budget now (CPython refcounting)
