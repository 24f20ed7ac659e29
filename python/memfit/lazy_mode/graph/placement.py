"""Where a lazy input's samples live: on the device that computes, or in host
memory, moved to the device one micro-batch at a time.

A batch "on the host" is CPU memory beside a GPU, or, on the simulated
device, memory allocated under memfit.host_memory() (or before tracking
began): memory outside the device's budget. memfit.lazy(x, device=d) keeps
such a batch where it is; the probes and each chunk copy their samples to d
as they run (pinned staging memory and non_blocking copies on CUDA, as the
common speed tips say), so the device holds one micro-batch of it at a time.
"""

import torch

from ..._native import allocation_id

__all__: list = []


def on_host(tensor, device):
    """True when `tensor` is not on `device` and must be moved there: another
    device, or (device "cpu") CPU memory the simulated device does not
    count."""
    if tensor.device.type != device.type:
        return True
    if device.type == "cpu":
        return allocation_id(tensor) is None
    return device.index is not None and tensor.device.index != device.index


def to_device(tensor, device):
    """A copy of `tensor` on `device` (one chunk of a host batch)."""
    if device.type == "cuda":
        if tensor.device.type == "cpu" and not tensor.is_pinned():
            tensor = tensor.pin_memory()  # staging; returned to torch's cache when copied
        return tensor.to(device, non_blocking=True)
    return tensor.to(device, copy=True)
