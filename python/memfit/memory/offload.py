"""memfit.offload: an optimizer's state and step kept on the host (see
OffloadedOptimizer's module, _step/offload.py, for the trade)."""

from __future__ import annotations

import torch

from .._step.offload import OffloadedOptimizer

__all__ = ["OffloadedOptimizer", "offload"]


def offload(optimizer: torch.optim.Optimizer) -> OffloadedOptimizer:
    """`optimizer` with its state and step on the host (CPU RAM beside a
    GPU): the device then holds no optimizer state and no step temporaries
    (for Adam, two copies of the parameters' bytes and more saved), at the
    cost of copying the parameters and gradients to the host and the
    parameters back each step. State the optimizer already has moves to the host.

        opt = memfit.offload(torch.optim.Adam(model.parameters(), lr=1e-3))

    Use the returned optimizer in place of the one given."""
    return OffloadedOptimizer(optimizer)
