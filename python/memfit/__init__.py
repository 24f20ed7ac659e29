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

from ._build_info import check_torch as _check_torch  # before the extension: one line

_check_torch()  # names both torch versions if memfit was built against another
from ._native import format_bytes, parse_size
from .memory import (OffloadedOptimizer, Tracking, host_memory, offload, simulated_device,
                     to_bytes, track)
from .diagnosis import Doctor, Finding, doctor
from .explain import load_snapshot
from .lazy_mode.api import LazyError, LazyRun, LazyTensor, eager, last_lazy_run, lazy
from .plan.advise import Advice, advise
from .plan.cost import CostRow, estimate_costs
from .plan.fit import DoesNotFit, auto_batch_size, find_batch_size
from .plan.ranks import RankFailed
from .plan.lengths import LengthFit
from .plan.surface import LengthSurface, length_surface
from .plan.strategies.chunked_loss import chunked_linear_cross_entropy, chunked_loss
from .report.profile import Report, profile
from .train.distributed import DistributedError, DistributedStepReport
from .train.length_sampler import LengthBatchSampler
from .train.trainer import Trainer
from . import _moved

__all__ = [
    "advise",
    "Advice",
    "auto_batch_size",
    "chunked_linear_cross_entropy",
    "chunked_loss",
    "CostRow",
    "DistributedError",
    "DistributedStepReport",
    "doctor",
    "estimate_costs",
    "Doctor",
    "DoesNotFit",
    "RankFailed",
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

__all__ += ["eager", "last_lazy_run", "lazy", "LazyError", "LazyRun", "LazyTensor"]
__all__ += ["LengthBatchSampler", "LengthFit", "LengthSurface", "length_surface"]

# Module paths from before the package had layers (memfit.profiling, ...):
# they still import, with a DeprecationWarning, for one release.
__getattr__ = _moved.install(__name__)
