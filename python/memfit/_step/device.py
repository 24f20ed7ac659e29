"""Sizes in bytes, the host scope beside a simulated device, the device a
budget is for. The simulated device itself is memfit.memory.device's."""

from __future__ import annotations

import contextlib

from .._native import native as _memfit
from .hints import Size

__all__: list = []

# Sizes are int64 bytes in the core.
_MAX_BYTES = (1 << 63) - 1


def to_bytes(size: Size, what: str = "size", name: str | None = None) -> int:
    """Bytes in `size`: an int of bytes, or a string like "16GiB" or "512MiB".

    Raises ValueError naming the accepted forms for anything else, tagged
    `what` (the call) and naming the argument `name` where given.
    """
    if name is not None:
        try:
            return to_bytes(size, what)
        except ValueError as e:  # "[what] ..." -> "[what] name: ..."
            tag = f"[{what}] "
            said = str(e)
            raise ValueError(tag + f"{name}: " + said[len(tag):] if said.startswith(tag)
                             else said) from None
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
