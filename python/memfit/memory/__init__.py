"""The device memfit plays and what it records there, the public names
memfit re-exports: simulated_device (a budget enforced on CPU
allocations), host_memory (the host beside it), to_bytes, track and
Tracking (every allocation of a block), offload and OffloadedOptimizer
(an optimizer's state and step on the host).

A layer of its own, just above _step, which keeps the machinery (the
recorder, the offloaded optimizer) these are made of."""

from .device import host_memory, simulated_device, to_bytes
from .offload import OffloadedOptimizer, offload
from .tracking import Tracking, track

__all__ = ["host_memory", "OffloadedOptimizer", "offload", "simulated_device", "to_bytes",
           "Tracking", "track"]
