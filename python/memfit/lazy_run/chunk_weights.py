"""Chunk weights: what a chunk's value of a reduction counts for in the full
batch's (c_i/B for a mean, the share of counted targets for
cross_entropy/nll_loss).
"""

import torch

from ..lazy_graph.node import Node, Sliced
from ..lazy_graph.template import _ChunkCtx, subst


def _class_count(target, weight, ignore_index):
    valid = target != ignore_index
    if weight is None:
        return valid.sum()
    safe = torch.where(valid, target, torch.zeros_like(target))
    return (weight.to(target.device)[safe] * valid).sum()


def _full_target(tmpl):
    if type(tmpl) is Node:
        from .values import read  # values.py uses this module

        return read(tmpl)
    if type(tmpl) is Sliced:
        return tmpl.tensor
    return tmpl


def _prepare_weights(roots):
    """Per root: [kind, denominator, target template, weight, ignore_index].
    The denominator of a class-count weight (the full batch's counted
    targets) is computed when a chunk first needs it: a batch run in one
    chunk never does."""
    out = {}
    for r in roots:
        if r.rkind == "classes":
            info = r.rinfo
            weight = info["weight"]
            if type(weight) is Node:
                from .values import read  # values.py uses this module

                weight = read(weight)
            out[r] = ["classes", None, info["target"], weight, info["ignore_index"]]
        else:
            out[r] = [r.rkind, None, None, None, None]
    return out


def _weight(spec, env, start, size, B):
    """The weight of a chunk's root value (None: 1)."""
    kind, D, tmpl, weight, ignore = spec
    if kind == "sum":
        return None
    if kind == "mean":
        return None if size == B else size / B
    if size == B and start == 0:
        return None
    if D is None:
        D = spec[1] = _class_count(_full_target(tmpl), weight, ignore)
    target = subst(tmpl, _ChunkCtx(env, start, size))
    return _class_count(target, weight, ignore) / D


def _weight_targets(weights):
    return [spec[2] for spec in weights.values() if type(spec[2]) is Node]
