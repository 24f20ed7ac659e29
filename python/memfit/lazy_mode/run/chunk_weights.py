"""Chunk weights: what a chunk's value of a reduction counts for in the full
batch's (c_i/B for a mean, the share of counted targets for
cross_entropy/nll_loss): see Note [How a chunk's loss counts in the batch's]
(_step/loss_rule.py), the rule the Trainer uses too.
"""

import dataclasses

from ..._step.loss_rule import counted_targets
from ..graph.node import Node, Sliced
from ..graph.template import ChunkCtx, subst

__all__: list = []


@dataclasses.dataclass
class ChunkWeight:
    """How one root's chunk values add up to the full batch's: kind "sum"
    (weight 1), "mean" (c_i/B) or "classes" (the chunk's share of the
    counted targets: target template, class weight, ignore_index; the full
    batch's count, `denominator`, computed when a chunk first needs it)."""

    kind: str
    target: object = None
    weight: object = None
    ignore_index: int = -100
    read: object = None  # computes the full targets for `denominator`
    denominator: object = None


def _full_target(tmpl, read):
    if type(tmpl) is Node:
        return read(tmpl)
    if type(tmpl) is Sliced:
        return tmpl.tensor
    return tmpl


def prepare_weights(roots, read):
    """Per root: its ChunkWeight. `read` computes a node's full value (a
    class weight, the targets)."""
    out = {}
    for r in roots:
        if r.rkind == "classes":
            info = r.rinfo
            weight = info["weight"]
            if type(weight) is Node:
                weight = read(weight)
            out[r] = ChunkWeight("classes", info["target"], weight, info["ignore_index"], read)
        else:
            out[r] = ChunkWeight(r.rkind)
    return out


def chunk_weight(spec, env, start, size, B, dtype):
    """The weight of a chunk's root value (None: 1), in the root's dtype."""
    if spec.kind == "sum":
        return None
    if spec.kind == "mean":
        return None if size == B else size / B
    if size == B and start == 0:
        return None
    if spec.denominator is None:
        spec.denominator = counted_targets(_full_target(spec.target, spec.read), spec.weight,
                                        spec.ignore_index)
    target = subst(spec.target, ChunkCtx(env, start, size))
    # Divided in float64, then the loss's dtype: two int64 counts divided as
    # tensors give float32, which rounded a float64 model's weights.
    counted = counted_targets(target, spec.weight, spec.ignore_index)
    return (counted.double() / spec.denominator.double()).to(dtype)


def weight_targets(weights):
    return [spec.target for spec in weights.values() if type(spec.target) is Node]
