"""Templates: a recorded call's arguments with Nodes in place of lazy tensors
and placeholders for batch-sized values, made real for a probe, a chunk or
the whole batch.
"""

import torch

from .errors import LazyError
from .node import Arange, BatchInt, Node, Sliced

__all__: list = []


def scan_args(obj, nodes, plains, bints, eager):
    """Template of obj (a call's arguments, Nodes where the user passed lazy
    tensors): a computed Node becomes its value; collects nodes, plain
    tensors, BatchInts, computed nodes."""
    t = type(obj)
    if t is Node:
        if obj.state == "eager":
            eager.append(obj)
            return obj.value
        nodes.append(obj)
        return obj
    if t is tuple or t is list:
        out = [scan_args(o, nodes, plains, bints, eager) for o in obj]
        return out if t is list else tuple(out)
    if t is dict:
        return {k: scan_args(v, nodes, plains, bints, eager) for k, v in obj.items()}
    if t is BatchInt:
        bints.append(obj)
        return obj
    if isinstance(obj, torch.Tensor):
        plains.append(obj)
        return obj
    if isinstance(obj, torch.Size):
        if any(type(o) is BatchInt for o in obj):
            return tuple(scan_args(o, nodes, plains, bints, eager) for o in obj)
        return obj
    return obj


def replace_plains(obj, mapping):
    """obj with the plain tensors in `mapping` (by id) replaced."""
    t = type(obj)
    if t is tuple or t is list:
        out = [replace_plains(o, mapping) for o in obj]
        return out if t is list else tuple(out)
    if t is dict:
        return {k: replace_plains(v, mapping) for k, v in obj.items()}
    if isinstance(obj, torch.Tensor):
        return mapping.get(id(obj), obj)
    return obj


class ProbeCtx:
    """Where subst() finds values when running on the i-th probe."""

    __slots__ = ("i", "start", "size")

    def __init__(self, i, size):
        self.i, self.start, self.size = i, 0, size

    def value(self, node):
        v = node.probe_at(self.i)
        # A lazy input's probe is a view of the user's tensor: the probed
        # operation gets a copy, so that a module writing into its input
        # (x.mul_(2)) does not write into the user's tensor.
        return v.clone() if node.kind == "leaf" and node.to_device is None else v


class ChunkCtx:
    __slots__ = ("env", "start", "size")

    def __init__(self, env, start, size):
        self.env, self.start, self.size = env, start, size

    def value(self, node):
        return self.env[node]


class EagerCtx:
    i = 0
    start = 0
    size = 1

    def value(self, node):
        return node.value if node.state == "eager" else node.probe_at(0)


def subst(obj, ctx):
    """The template `obj` made real for a probe or a chunk."""
    t = type(obj)
    if t is Node:
        return ctx.value(obj)
    if t is tuple:
        return tuple([subst(o, ctx) for o in obj])
    if t is list:
        return [subst(o, ctx) for o in obj]
    if t is dict:
        return {k: subst(v, ctx) for k, v in obj.items()}
    if t is BatchInt:
        return obj.k * ctx.size
    if t is Sliced:
        return obj.tensor.narrow(obj.dim, obj.k * ctx.start, obj.k * ctx.size)
    if t is Arange:
        return torch.arange(ctx.start, ctx.start + ctx.size, device=obj.device,
                            dtype=obj.dtype) - ctx.start
    return obj


def materialize_args(obj, read):
    t = type(obj)
    if t is Node:
        return read(obj)
    if t is tuple or t is list:
        out = [materialize_args(o, read) for o in obj]
        return out if t is list else tuple(out)
    if t is dict:
        return {k: materialize_args(v, read) for k, v in obj.items()}
    if t is Sliced:
        return obj.tensor
    if t is Arange:
        raise LazyError("memfit.lazy: internal: arange index in a Python-valued op")
    return obj


def flatten_args(obj):
    if isinstance(obj, (tuple, list)):
        for o in obj:
            yield from flatten_args(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from flatten_args(o)
    else:
        yield obj


def pluck(value, path):
    for p in path:
        value = value[p]
    return value
