"""Checks that refuse operations mixing samples across the batch dimension:
known by name (softmax or cumsum over the batch, selecting samples,
batch-first operations, norms, attention), and indexing.
"""

import torch

from .errors import mix_error
from .names import display_name
from .node import Arange, Node
from .op_tables import BATCH_FIRST, DIM_MIXERS, SELECTORS

__all__: list = []


def _norm_dim(d, ndim):
    if d is None:
        return None
    d = int(d)
    return d + ndim if d < 0 else d


def _arg(args, kwargs, name, pos, default=None):
    if name is not None and name in kwargs:
        return kwargs[name]
    if pos is not None and len(args) > pos:
        return args[pos]
    return default


def bdim_set(node):
    return {d for d, _ in node.bdims} | set(node.ragged)


def check_mixing(fn, op, args, kwargs, first, batched, where):
    """Raise for name-known operations that mix samples. `first` is the
    first lazy tensor argument's node (None if the first arg is not lazy)."""
    label = f"{display_name(fn)} at {where}"
    if first is None or first.state != "batched":
        if op == "batch_norm" and batched:
            pass
        else:
            return
    ndim = len(first.shape) if first is not None and first.shape is not None else 0
    bd = bdim_set(first) if first is not None else set()
    if op in DIM_MIXERS:
        name, pos, default = DIM_MIXERS[op]
        dims = _arg(args, kwargs, name, pos, None) if name else None
        if dims is None:
            if default == "softmax":
                dims = 0 if ndim in (0, 1, 3) else 1
            elif default == "all":
                dims = list(range(ndim))
            else:
                dims = default
        if dims is None:
            return
        dims = dims if isinstance(dims, (list, tuple)) else [dims]
        if any(_norm_dim(d, ndim) in bd for d in dims):
            raise mix_error(f"{display_name(fn)} along the batch dimension", label)
        return
    if op in SELECTORS:
        name, pos = SELECTORS[op]
        if name is None:
            raise mix_error(f"{display_name(fn)} (indexes the flattened tensor)", label)
        d = _arg(args, kwargs, name, pos, 0 if op in ("split", "chunk", "tensor_split",
                                                    "unbind", "split_with_sizes") else None)
        if d is None:  # take_along_dim without dim flattens
            raise mix_error(f"{display_name(fn)} over the flattened tensor", label)
        if _norm_dim(d, ndim) in bd:
            raise mix_error(
                f"{display_name(fn)} picks entries of the batch dimension by position",
                label,
                "Select samples before memfit.lazy(), or pass allow_mixing=True to run "
                "it whole.",
            )
        return
    if op in BATCH_FIRST:
        if bd != {0} or first.ragged:
            raise mix_error(
                f"{display_name(fn)} reads dimension 0 as the batch, but the batch is in "
                f"dimension(s) {sorted(bd)}", label)
        return
    if op == "layer_norm":
        ns = _arg(args, kwargs, "normalized_shape", 1, ())
        ns = [ns] if isinstance(ns, int) else list(ns)
        if any(d in bd for d in range(ndim - len(ns), ndim)):
            raise mix_error("F.layer_norm normalizes over the batch dimension", label)
        return
    if op == "batch_norm":
        # F.batch_norm(input, running_mean, running_var, weight, bias, training, ...)
        # torch.batch_norm(input, weight, bias, running_mean, running_var, training, ...)
        training = _arg(args, kwargs, "training", 5, False)
        if training:
            raise mix_error(
                "batch_norm in training mode (normalizes with statistics of the whole "
                "batch)", label,
                "Put the BatchNorm layers in eval mode, use GroupNorm/LayerNorm, or pass "
                "allow_mixing=True to run the step whole.")
        if bd != {0}:
            raise mix_error("batch_norm with the batch outside dimension 0", label)
        return
    if op == "multi_head_attention_forward" or op == "scaled_dot_product_attention":
        if op == "multi_head_attention_forward":
            expect = {1} if ndim == 3 else set()
        else:
            expect = None
        if expect is not None and bd != expect:
            raise mix_error(
                f"{display_name(fn)} with the batch in dimension(s) {sorted(bd)} of a "
                f"(L, N, E) query: attention would run across samples", label)
        if expect is None and bd & {ndim - 1, ndim - 2}:
            raise mix_error("attention over the batch dimension", label)


def getitem_analysis(first, index, where):
    """Check x[index] for a batched x; returns the index with arange
    indices of the batch dimension marked, or raises."""
    idx = index if type(index) is tuple else (index,)
    ndim = len(first.shape)
    bd = bdim_set(first)

    def width(e):
        if e is None or e is Ellipsis:
            return 0
        if type(e) is Node:
            return len(e.shape) if e.dtype == torch.bool else 1
        if isinstance(e, torch.Tensor) and e.dtype == torch.bool:
            return e.dim()
        return 1

    used = sum(width(e) for e in idx)
    out = []
    d = 0
    label = f"indexing x[...] at {where}"
    for e in idx:
        if e is None:
            out.append(e)
            continue
        if e is Ellipsis:
            d += ndim - used
            out.append(e)
            continue
        w = width(e)
        covered = set(range(d, d + w))
        if covered & bd:
            ok = False
            if isinstance(e, slice) and e == slice(None):
                ok = True
            elif type(e) is Node and e.dtype == torch.bool and e.state == "batched":
                # a per-sample mask aligned with the batch dimension(s)
                ok = {dd + d for dd in bdim_set(e)} == (covered & bd)
            elif isinstance(e, (torch.Tensor, range, list)) and not (
                isinstance(e, torch.Tensor) and e.dtype == torch.bool
            ):
                t = e if isinstance(e, torch.Tensor) else torch.as_tensor(list(e))
                n = first.shape[d]
                if (t.dim() == 1 and t.numel() == n and len(bd & covered) == 1
                        and dict(first.bdims).get(d) == 1
                        and torch.equal(t.cpu(), torch.arange(n, dtype=t.dtype))):
                    e = Arange(t.device if isinstance(e, torch.Tensor) else first.device,
                               t.dtype)
                    ok = True
            if not ok:
                raise mix_error(
                    "indexing the batch dimension (x[i], x[a:b], x[idx]) picks samples by "
                    "position", label,
                    "Keep ':' for the batch dimension (a lazy boolean mask works too), "
                    "select samples before memfit.lazy(), or pass allow_mixing=True.")
        out.append(e)
        d += w
    return tuple(out) if type(index) is tuple else out[0]
