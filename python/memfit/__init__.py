"""memfit: make PyTorch training fit the memory you have, and show where it goes.

    with memfit.simulated_device("16GiB"):      # rehearse a 16 GiB card on CPU
        ...                                      # OOM raises torch.cuda.OutOfMemoryError

    with memfit.track() as t:                    # record every allocation
        loss = model(x).sum(); loss.backward()
    print(t.peak_bytes, t.timeline.breakdown_at_peak())
"""

from ._memfit import format_bytes, parse_size
from .device import simulated_device, to_bytes
from .profile import Report, profile
from .tracking import Tracking, track

__all__ = [
    "format_bytes",
    "parse_size",
    "profile",
    "Report",
    "simulated_device",
    "to_bytes",
    "track",
    "Tracking",
]
