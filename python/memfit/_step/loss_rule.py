"""How a loss over a batch is made of its micro-batches' losses: the one rule
by which memfit.lazy and memfit.Trainer weight each chunk, so that the
accumulated gradients equal the full batch's.

Note [How a chunk's loss counts in the batch's]
A loss that reduces the batch with a sum counts each chunk with weight 1; a
mean over samples (or elements, the same number per sample) with c_i/B. The
classification losses cross_entropy and nll_loss with reduction="mean" are
neither when a target is ignored (ignore_index) or a class weight is given:
torch divides by the counted targets, the sum of the weights of the targets
not ignored. A chunk then counts with its share of the counted targets,
counted(chunk)/counted(batch); weighting it by samples gives wrong
gradients (and NaN for a chunk whose targets are all ignored).
"""

from __future__ import annotations

import dataclasses
import inspect

import torch
import torch.nn.functional as F

__all__: list = []


def _loss_table():
    """fn -> (name, per-sample arguments, kind, takes a class weight)."""
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


#: torch's loss functions: fn -> (name, per-sample arguments, kind, class weight).
LOSSES = _loss_table()

_SIGNATURES = {}


def bind_arguments(fn, args, kwargs):
    """The arguments of a call of `fn` by name, defaults applied; None when
    they do not bind (or `fn` has no signature)."""
    sig = _SIGNATURES.get(fn)
    if sig is None:
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = False
        _SIGNATURES[fn] = sig
    if not sig:
        return None
    try:
        b = sig.bind(*args, **kwargs)
    except TypeError:
        return None
    b.apply_defaults()
    return b.arguments


def reduction_of(arguments):
    """The reduction string of a bound F.*_loss call (legacy size_average and
    reduce too)."""
    size_average = arguments.get("size_average")
    reduce = arguments.get("reduce")
    if size_average is not None or reduce is not None:
        from torch.nn import _reduction as legacy

        return legacy.legacy_get_string(size_average, reduce, emit_warning=False)
    return arguments.get("reduction", "mean")


@dataclasses.dataclass
class LossRule:
    """How one reduction over the batch adds up from chunks: kind "sum"
    (weight 1), "mean" (c_i/B) or "classes" (the chunk's share of the
    counted targets: `target`, class `weight`, `ignore_index`). `name`: the
    function, for messages."""

    kind: str
    name: str = ""
    target: object = None
    weight: object = None
    ignore_index: int = -100


def loss_rule(fn, arguments, target_dtype=None):
    """The LossRule of a call of torch loss function `fn` with bound
    `arguments`, or None when it does not reduce over the batch (reduction
    "none") or `fn` is not one of LOSSES. `target_dtype`: the target's dtype
    (class indices make cross_entropy/nll_loss count their targets; class
    probabilities are a plain mean)."""
    loss = LOSSES.get(fn)
    if loss is None:
        return None
    name, _, kind, _ = loss
    red = reduction_of(arguments)
    if red == "sum":
        return LossRule("sum", name)
    if red == "batchmean" or (red == "mean" and name == "ctc_loss"):
        return LossRule("mean", name)
    if red != "mean":
        return None
    if kind == "classes" and target_dtype is not None and not target_dtype.is_floating_point:
        return LossRule("classes", name, arguments.get("target"), arguments.get("weight"),
                        arguments.get("ignore_index", -100))
    return LossRule("mean", name)


def counted_targets(target, weight, ignore_index):
    """What cross_entropy/nll_loss with reduction="mean" divide by: the number
    of targets not equal to `ignore_index`, each counted by its class weight
    when `weight` is given. See Note [How a chunk's loss counts in the
    batch's]."""
    # In slices: counting must not take 9 bytes per target at once (a bool
    # mask and its int64 sum) beside a batch that fits the device.
    flat = target.reshape(-1)
    if weight is not None:
        weight = weight.to(target.device)
    total = None
    for start in range(0, max(flat.numel(), 1), _COUNT_SLICE):
        part = flat[start:start + _COUNT_SLICE]
        valid = part != ignore_index
        if weight is None:
            n = valid.sum()
        else:
            safe = torch.where(valid, part, torch.zeros_like(part))
            n = (weight[safe] * valid).sum()
        total = n if total is None else total + n
    return total


_COUNT_SLICE = 1 << 16
