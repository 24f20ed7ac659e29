"""memfit: make PyTorch training fit the memory you have, and show where it goes.

    with memfit.simulated_device("16GiB"):      # rehearse a 16 GiB card on CPU
        ...                                      # OOM raises torch.cuda.OutOfMemoryError

    with memfit.track() as t:                    # record every allocation
        loss = model(x).sum(); loss.backward()
    print(t.peak_bytes, t.timeline.breakdown_at_peak())

    with memfit.doctor(model, optimizer) as d:   # the memory mistakes of a loop
        for x, y in loader: ...
    print(d.report())
"""

from ._memfit import format_bytes, parse_size
from .advising import Advice, advise
from .device import host_memory, simulated_device, to_bytes
from .diagnosis import Doctor, Finding, doctor
from .explain import load_snapshot
from .distributed import DistributedError, DistributedStepReport
from .fit import DoesNotFit, auto_batch_size, find_batch_size
from .host_offload import OffloadedOptimizer, offload
from .profiling import Report, profile
from .step_cost import CostRow, estimate_costs
from .trainer import Trainer
from .tracking import Tracking, track

__all__ = [
    "advise",
    "Advice",
    "auto_batch_size",
    "CostRow",
    "DistributedError",
    "DistributedStepReport",
    "doctor",
    "estimate_costs",
    "Doctor",
    "DoesNotFit",
    "find_batch_size",
    "Finding",
    "format_bytes",
    "host_memory",
    "load_snapshot",
    "offload",
    "OffloadedOptimizer",
    "parse_size",
    "profile",
    "Report",
    "simulated_device",
    "to_bytes",
    "track",
    "Tracking",
    "Trainer",
]

# memfit.lazy: record a computation on a batch, run it in chunks that fit.
from .lazy_api import LazyError, LazyRun, LazyTensor, eager, last_lazy_run, lazy  # noqa: E402

__all__ += ["eager", "last_lazy_run", "lazy", "LazyError", "LazyRun", "LazyTensor"]
