"""Optimizer state and zero_grad: which optimizer the step uses, and whether
zero_grad frees the gradients (set_to_none) or zeroes them in place."""

import torch

from ..profile import _OPTIMIZERS

LIGHTER = {"adam": ["momentum", "sgd"], "momentum": ["sgd"], "sgd": []}


def kind_of(optimizer):
    """"adam", "momentum", "sgd" for the built-in names and for torch's Adam
    and SGD; the class name for other optimizers; "none" for None."""
    if optimizer is None:
        return "none"
    if isinstance(optimizer, str):
        return optimizer
    if type(optimizer) is torch.optim.Adam:
        return "adam"
    if type(optimizer) is torch.optim.SGD:
        momentum = optimizer.defaults.get("momentum", 0)
        return "momentum" if momentum else "sgd"
    return type(optimizer).__name__


def _clone(optimizer):
    """A fresh optimizer of the same class and hyperparameters over the same
    parameters, with no state."""
    groups = [dict(g) for g in optimizer.param_groups]
    try:
        return type(optimizer)(groups)
    except TypeError:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        return type(optimizer)(params, **optimizer.defaults)


def _zero_grad_in_place(optimizer):
    def zero_grad(set_to_none=False):
        torch.optim.Optimizer.zero_grad(optimizer, set_to_none=False)

    optimizer.zero_grad = zero_grad
    return optimizer


def optimizer_for(model, user_optimizer, name=None, zero_grad_in_place=False):
    """What memfit.profile takes as the step's optimizer: the user's (a name,
    an Optimizer, or None) when `name` is None, else the built-in `name`;
    with zero_grad_in_place, a fresh optimizer whose zero_grad keeps the
    gradients' memory (set_to_none=False)."""
    chosen = user_optimizer if name is None else name
    if not zero_grad_in_place or chosen is None:
        return chosen
    if isinstance(chosen, str):
        opt = _OPTIMIZERS[chosen]([p for p in model.parameters() if p.requires_grad])
    else:
        opt = _clone(chosen)
    return _zero_grad_in_place(opt)


def make_optimizer(model, user_optimizer, name=None):
    """A fresh optimizer for timing steps (never the user's instance)."""
    chosen = user_optimizer if name is None else name
    if chosen is None:
        return None
    if isinstance(chosen, str):
        return _OPTIMIZERS[chosen]([p for p in model.parameters() if p.requires_grad])
    return _clone(chosen)
