"""Plain tensors passed with lazy ones: which hold one entry per sample
(sliced with the chunk) and which are the same for every sample.
"""

import torch

from .errors import LazyError
from .losses import LOSSES
from .names import display_name
from .node import Sliced
from .op_tables import POINTWISE, bind_args

__all__: list = []


def plain_rules(fn, op, targs, tkw, args, kwargs, plains, first, B, where, module):
    """Decide, for each plain tensor argument, whether it holds samples
    (sliced with the chunk) or is the same for every sample. Returns a
    mapping id(tensor) -> Sliced, or raises when it cannot tell."""
    mapping = {}
    if not plains or first is None or first.state != "batched" or B is None or B < 2:
        return mapping
    factors = {k for _, k in first.bdims} or {1}
    sizes = {k * B for k in factors}
    loss = LOSSES.get(fn)
    if loss is not None:
        # Targets (and second inputs) of torch's losses hold one entry per
        # sample along dimension 0, like the input; a per-element `weight`
        # broadcasts like an elementwise operand; class weights are constants.
        arguments = bind_args(fn, args, kwargs) or {}
        fb = first.single_bdim()
        n = len(first.shape)
        skip = set()
        plain_ids = {id(t) for t in plains}
        for pname in loss[1]:
            t = arguments.get(pname)
            if id(t) not in plain_ids or t.requires_grad or fb is None:
                continue
            j = fb[0] - (n - t.dim()) if pname == "weight" else fb[0]
            if fb[0] == 0 or pname == "weight":
                if 0 <= j < t.dim() and t.shape[j] == fb[1] * B:
                    mapping[id(t)] = Sliced(t, j, fb[1])
                elif pname == "weight":
                    skip.add(id(t))  # broadcast over the samples
        if loss[3]:
            skip.add(id(arguments.get("weight")))
        skip.add(id(arguments.get("pos_weight")))
        _refuse_sample_sized([t for t in plains if id(t) not in skip and id(t) not in mapping],
                             sizes, fn, where, B, module)
        return mapping
    if op in POINTWISE:
        fb = first.single_bdim() or (first.bdims[0] if first.bdims else None)
        n = len(first.shape)
        for t in plains:
            if t.requires_grad or fb is None:
                continue
            j = fb[0] - (n - t.dim())
            if 0 <= j < t.dim() and t.shape[j] == fb[1] * B and t.shape[j] > 1:
                if first.interleaved and fb[1] > 1:
                    raise LazyError(
                        f"memfit.lazy: a plain tensor of shape {tuple(t.shape)} is combined "
                        f"in {display_name(fn)} at {where} with a lazy tensor whose batch "
                        f"dimension is interleaved with another; make it lazy too")
                mapping[id(t)] = Sliced(t, j, fb[1])
        return mapping
    if op == "getitem":
        return mapping  # indices are handled by getitem_analysis
    _refuse_sample_sized(plains, sizes, fn, where, B, module)
    return mapping


def _refuse_sample_sized(plains, sizes, fn, where, B, module):
    for t in plains:
        if t.requires_grad or isinstance(t, torch.nn.Parameter):
            continue
        hits = [d for d, s in enumerate(t.shape) if s in sizes]
        if hits:
            raise LazyError(
                f"memfit.lazy: a plain tensor of shape {tuple(t.shape)} is passed to "
                f"{display_name(fn)} at {where} together with lazy tensors of {B} samples, "
                f"and its dimension {hits[0]} has {t.shape[hits[0]]} entries. memfit cannot "
                f"tell whether it holds one entry per sample. If it does, make it lazy too: "
                f"memfit.lazy(t, batch={hits[0]}); if it is the same for every sample, pass "
                f"memfit.lazy(t, batch=None)."
            )
