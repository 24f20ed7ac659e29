"""torch's loss functions as memfit sees them (which arguments hold one entry
per sample, how they reduce), and how a reduction's chunk results add up.
"""

import torch
import torch.nn.functional as F

from .node import Node
from .op_tables import bind_args

__all__ = ["LOSSES", "root_kind"]


def _loss_table():
    t = {}

    def add(name, per_sample, kind="elementwise", class_weight=False):
        fn = getattr(F, name, None)
        if fn is not None:
            t[fn] = (name, per_sample, kind, class_weight)

    add("cross_entropy", ("target",), "classes", True)
    add("nll_loss", ("target",), "classes", True)
    for n in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "soft_margin_loss",
              "hinge_embedding_loss", "multilabel_margin_loss", "poisson_nll_loss", "kl_div"):
        add(n, ("target",))
    add("binary_cross_entropy", ("target", "weight"))
    add("binary_cross_entropy_with_logits", ("target", "weight"))  # weight: per element
    add("gaussian_nll_loss", ("target", "var"))
    add("margin_ranking_loss", ("input2", "target"))
    add("cosine_embedding_loss", ("input2", "target"))
    add("multilabel_soft_margin_loss", ("target",), "elementwise", True)
    add("multi_margin_loss", ("target",), "elementwise", True)
    add("triplet_margin_loss", ("positive", "negative"))
    add("triplet_margin_with_distance_loss", ("positive", "negative"))
    add("ctc_loss", ())
    return t


LOSSES = _loss_table()


def _reduction(arguments):
    """The reduction string of a bound F.*_loss call (legacy arguments too)."""
    size_average = arguments.get("size_average")
    reduce = arguments.get("reduce")
    if size_average is not None or reduce is not None:
        from torch.nn import _reduction as _R

        return _R.legacy_get_string(size_average, reduce, emit_warning=False)
    return arguments.get("reduction", "mean")


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
    loss = LOSSES.get(fn)
    if loss is None:
        return
    arguments = bind_args(fn, args, kwargs)
    if arguments is None:
        return
    red = _reduction(arguments)
    lname, _, kind, _ = loss
    if red == "sum":
        n.rkind = "sum"
    elif red == "batchmean":
        n.rkind = "mean"
    elif red == "mean":
        n.rkind = "mean"
        if kind == "classes":
            target = arguments.get("target")
            # a lazy target arrives as its Node
            tdtype = target.dtype if type(target) is Node or isinstance(target, torch.Tensor) \
                else None
            if tdtype is not None and not tdtype.is_floating_point:
                tb = bind_args(fn, targs, tkw) or {}
                n.rkind = "classes"
                n.rinfo = {
                    "target": tb.get("target"),
                    "weight": arguments.get("weight"),
                    "ignore_index": arguments.get("ignore_index", -100),
                }
        if lname == "ctc_loss":
            n.rkind = "mean"
