"""Gradient bookkeeping: the tensors whose .grad a chunk's backward may
accumulate into, whether chunks must retain a shared autograd history, and
which .grad a failed backward touched (for OOM recovery).
"""

import weakref

import torch

from ..graph.node import Sliced

__all__: list = []


def grad_candidates(order, sources, user_inputs):
    """Every tensor whose .grad a chunk's backward may accumulate into."""
    if user_inputs is not None:
        return list(user_inputs)
    seen = {}

    def add(t):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            if t.is_leaf:
                seen.setdefault(id(t), t)
            else:
                _leaves_of(t, add)

    def scan(obj):
        t = type(obj)
        if t is tuple or t is list:
            for o in obj:
                scan(o)
        elif t is dict:
            for o in obj.values():
                scan(o)
        elif t is Sliced:
            add(obj.tensor)
        elif isinstance(obj, torch.Tensor):
            add(obj)

    for n in order:
        if n in sources:
            if isinstance(n.value, torch.Tensor):
                add(n.value)
            continue
        if n.module is not None:
            for p in n.module.parameters():
                add(p)
        scan(n.args)
        scan(n.kwargs)
    return list(seen.values())


def _leaves_of(t, add):
    stack = [t.grad_fn]
    seen = set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)
        if var is not None:
            add(var)
        stack.extend(f for f, _ in fn.next_functions)


def retain_needed(order, sources):
    """True when a plain tensor with an autograd history is used, so each
    chunk's backward must keep that shared history."""

    def hist(obj):
        t = type(obj)
        if t is tuple or t is list:
            return any(hist(o) for o in obj)
        if t is dict:
            return any(hist(o) for o in obj.values())
        if t is Sliced:
            return obj.tensor.grad_fn is not None
        if isinstance(obj, torch.Tensor):
            return obj.grad_fn is not None
        return False

    for n in order:
        if n in sources:
            if isinstance(n.value, torch.Tensor) and n.value.grad_fn is not None:
                return True
            continue
        if hist(n.args) or hist(n.kwargs):
            return True
    return False


def grad_snapshot(tensors):
    """What the .grad of each of `tensors` is before a chunk's attempt."""
    snap = []
    for p in tensors:
        g = p.grad
        snap.append((weakref.ref(g), g._version) if g is not None else None)
    return snap


def changed_grads(tensors, snap):
    """Indices of `tensors` whose .grad the failed backward touched (made,
    replaced or accumulated into) since grad_snapshot."""
    out = []
    for i, (p, s) in enumerate(zip(tensors, snap)):
        g = p.grad
        if s is None:
            changed = g is not None
        else:
            ref, version = s
            changed = ref() is not g or g is None or g._version != version
        if changed:
            out.append(i)
    return out
