"""Optimizer state and zero_grad: which optimizer the step uses, and whether
zero_grad frees the gradients (set_to_none) or zeroes them in place."""

import torch

from ..._native import native
from ..._step.offload import OffloadedOptimizer, construct
from ...memory.offload import offload
from ..._step.training_step import OPTIMIZERS, builtin_name

__all__: list = []

# Which optimizers advise compares, and which are lighter, is the core's
# rule (optimizer_choices, core/plan/advise_plan.h), for both fronts.


def kind_of(optimizer):
    """The built-in name (OPTIMIZERS) for a name and for a torch optimizer
    built as a built-in is ("adam" for torch's Adam, "momentum" or "sgd"
    for its SGD); the class name for other optimizers; "none" for None; with
    "-offload" after it for an OffloadedOptimizer."""
    if optimizer is None:
        return "none"
    if isinstance(optimizer, str):
        return optimizer
    if isinstance(optimizer, OffloadedOptimizer):
        return kind_of(optimizer.inner) + native.OFFLOAD_SUFFIX
    return builtin_name(optimizer) or type(optimizer).__name__


def _clone(optimizer):
    """A fresh optimizer of the same class and hyperparameters over the same
    parameters, with no state."""
    if isinstance(optimizer, OffloadedOptimizer):
        return optimizer.fresh()
    groups = [dict(g) for g in optimizer.param_groups]
    return construct(type(optimizer), groups, optimizer.defaults)


def _zero_grad_in_place(optimizer):
    def zero_grad(set_to_none=False):
        torch.optim.Optimizer.zero_grad(optimizer, set_to_none=False)

    optimizer.zero_grad = zero_grad
    return optimizer


def optimizer_for(model, user_optimizer, name=None, zero_grad_in_place=False,
                  host_state=False):
    """What memfit.profile takes as the step's optimizer: the user's (a name,
    an Optimizer, or None) when `name` is None, else the built-in `name`;
    with zero_grad_in_place, a fresh optimizer whose zero_grad keeps the
    gradients' memory (set_to_none=False); with host_state, a fresh one
    whose state and step are on the host (memfit.offload)."""
    chosen = user_optimizer if name is None else name
    if host_state:
        chosen = offload(make_optimizer(model, chosen))
    if not zero_grad_in_place or chosen is None:
        return chosen
    if isinstance(chosen, str):
        opt = OPTIMIZERS[chosen]([p for p in model.parameters() if p.requires_grad])
    else:
        opt = _clone(chosen)
    return _zero_grad_in_place(opt)


def make_optimizer(model, user_optimizer, name=None, host_state=False):
    """A fresh optimizer for timing steps (never the user's instance); with
    host_state, offloaded."""
    chosen = user_optimizer if name is None else name
    if chosen is None:
        return None
    if host_state:
        return offload(make_optimizer(model, chosen))
    if isinstance(chosen, str):
        return OPTIMIZERS[chosen]([p for p in model.parameters() if p.requires_grad])
    return _clone(chosen)
