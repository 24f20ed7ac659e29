"""The simulated device: a memory budget enforced on CPU allocations."""

from __future__ import annotations

import contextlib
from typing import ContextManager

from .._native import native as _memfit
from . import oom_explain
from .hints import Size

__all__ = ["to_bytes", "simulated_device", "host_memory", "budget_target"]

# Sizes are int64 bytes in the core.
_MAX_BYTES = (1 << 63) - 1


def to_bytes(size: Size, what: str = "size") -> int:
    """Bytes in `size`: an int of bytes, or a string like "16GiB" or "512MiB".

    Raises ValueError naming the accepted forms for anything else.
    """
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise ValueError(
            f"[{what}] expected an int of bytes or a string like '16GiB', "
            f"got {type(size).__name__} {size!r}"
        )
    if isinstance(size, str):
        try:
            return _memfit.parse_size(size)
        except ValueError as e:  # the parser names itself; the user called `what`
            said = str(e)
            if what == "size" or not said.startswith("[parse_size] "):
                raise
            raise ValueError(f"[{what}] " + said[len("[parse_size] "):]) from None
    if size < 0:
        raise ValueError(
            f"[{what}] cannot use {size} as a size: it must be >= 0 bytes "
            f"(an int of bytes, or a string like '16GiB')"
        )
    if size > _MAX_BYTES:
        raise ValueError(
            f"[{what}] {size} bytes is more than memfit can count (at most 2**63 - 1 bytes, "
            f"8 EiB): pass a real device's size, e.g. '80GiB'"
        )
    return size


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


@contextlib.contextmanager
def host_memory() -> int | None:
    """Allocations made in the block on this thread are the host's, not the
    simulated device's: untracked, in no profile, under no budget, as the
    RAM beside a GPU is not the GPU's. memfit.offload keeps optimizer state
    there; on a real GPU the same code keeps it in CPU RAM."""
    handle = _memfit.HostMemory()
    try:
        yield
    finally:
        del handle  # ends the host scope now (CPython refcounting)


def budget_target(model, target_device, who):
    """The device a budget is for: `target_device` ("cpu" or "cuda"), or
    None: "cuda" when `model`'s parameters are on a CUDA device, else "cpu".
    Raises ValueError, one line naming `who`, for anything else."""
    if target_device is None:
        return "cuda" if any(p.is_cuda for p in model.parameters()) else "cpu"
    if target_device not in ("cpu", "cuda"):
        raise ValueError(f"[{who}] target_device must be 'cpu' or 'cuda' (the card the budget "
                         f"is for), got {target_device!r}")
    return target_device
