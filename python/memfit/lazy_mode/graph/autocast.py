"""Autocast: the state in force when an operation is recorded, and entering it
again when the operation runs.
"""

import torch

__all__: list = []


try:  # torch >= 2.4: per-device autocast queries (the old ones are deprecated)
    torch.is_autocast_enabled("cpu")

    def _autocast_state():
        return tuple((d, torch.get_autocast_dtype(d)) for d in ("cuda", "cpu")
                     if torch.is_autocast_enabled(d))
except TypeError:  # torch 1.13 .. 2.3

    def _autocast_state():
        out = []
        if torch.is_autocast_enabled():
            out.append(("cuda", torch.get_autocast_gpu_dtype()))
        if torch.is_autocast_cpu_enabled():
            out.append(("cpu", torch.get_autocast_cpu_dtype()))
        return tuple(out)


def grad_autocast():
    """(grad enabled, autocast state or None) now."""
    return torch.is_grad_enabled(), (_autocast_state() or None)


def autocast_ctx(ac):
    import contextlib

    stack = contextlib.ExitStack()
    for device_type, dtype in ac:
        stack.enter_context(torch.autocast(device_type=device_type, dtype=dtype))
    return stack
