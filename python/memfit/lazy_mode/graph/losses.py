"""torch's loss functions as memfit sees them (which arguments hold one entry
per sample, how they reduce), and how a reduction's chunk results add up.
"""

import torch

from ..._step.loss_rule import LOSSES, loss_rule
from .node import Node
from .op_tables import bind_args

__all__: list = []


def root_kind(n, fn, op, args, kwargs, targs, tkw, first):
    """For a node that reduces batched values: how chunk results add up.
    rkind "sum" (chunks add), "mean" (chunk i weighs c_i/B), "classes"
    (cross_entropy/nll_loss mean: weighs its counted targets), else None."""
    if any(p.ragged for p in n.parents if p.state == "batched"):
        if op in ("sum", "nansum"):
            n.rkind = "sum"
        return
    if op in ("sum", "nansum"):
        n.rkind = "sum"
        return
    if op == "mean":
        n.rkind = "mean"
        return
    if fn not in LOSSES:
        return
    arguments = bind_args(fn, args, kwargs)
    if arguments is None:
        return
    # See Note [How a chunk's loss counts in the batch's] (_step/loss_rule.py).
    target = arguments.get("target")
    # a lazy target arrives as its Node
    tdtype = target.dtype if type(target) is Node or isinstance(target, torch.Tensor) else None
    rule = loss_rule(fn, arguments, tdtype)
    if rule is None:
        return
    n.rkind = rule.kind
    if rule.kind == "classes":
        tb = bind_args(fn, targs, tkw) or {}
        n.rinfo = {"target": tb.get("target"), "weight": rule.weight,
                   "ignore_index": rule.ignore_index}
