"""Recording every allocation of a block of code: memfit.track()."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from .._step.tracking import Tracking

__all__ = ["Tracking", "track"]


# Note [Phases of a step memfit does not run]
# profile() runs the step itself and names each phase as it goes. In
# memfit.track(model, optimizer) the user's code runs it, so hooks name the
# phases: the model's forward pre-hook begins "forward" (a new iteration
# unless already in one), its forward hook "loss" (what the loop computes
# from the output), a hook on the output's gradient, or the first
# parameter's, "backward", and the optimizer's step hooks "optimizer_step"
# and then "zero_grad". The phase gives each allocation its default category
# (activation, gradient, optimizer state), as in profile(); parameters'
# .grad and the optimizer's state are then classified exactly, and
# parameters and buffers the block made are classified when it ends.
@contextlib.contextmanager
def track(model: torch.nn.Module | None = None,
          optimizer: torch.optim.Optimizer | None = None) -> Iterator[Tracking]:
    """Record every CPU and meta allocation made inside the block.

        with memfit.track(model, optimizer) as t:
            loss_fn(model(x), y).backward()
            optimizer.step()
        t.peak_bytes, t.timeline.breakdown_at_peak(), t.timeline.peak_phase

    With `model`, allocations are attributed to its submodules, each named
    by path and class ("0 (Linear)"), and the step's phases (forward, loss,
    backward, optimizer_step with `optimizer`) and categories (parameters,
    gradients, optimizer state, activations) are named as profile() names
    them (see Note [Phases of a step memfit does not run]). A compiled
    model (torch.compile, model.compile()) is watched from outside its
    compiled code, so nothing recompiles: what runs inside is attributed to
    the compiled module (See Note [Recording a compiled step]).

    peak_bytes counts what the block allocated: memory alive before it and
    freed inside (a loop's previous pred and loss, replaced in the block) is
    not taken off, so there it is above the rise of the device's own counter.
    """
    if optimizer is not None and model is None:
        raise ValueError("[track] an optimizer needs its model: memfit.track(model, optimizer)")
    t = Tracking()
    if model is not None:
        t.watch_modules(model, classes=True)
        t.watch_step(model, optimizer)
    try:
        yield t
    finally:
        t.stop()
