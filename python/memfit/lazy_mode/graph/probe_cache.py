"""The probe cache: what the probes taught, kept per operation and argument
shapes (see Note [Probe cache]).
"""

import torch

from .node import Arange, BatchInt, Node, Sliced

__all__: list = []


# Note [Probe cache]: a training loop records the same operations on
# tensors of the same shapes at every step. What the probes teach (batch
# dimensions, shapes, dtypes, whether gradients are needed, whether samples
# mix) depends only on the operation and the shapes, dtypes and devices of
# its arguments (for a module: its identity, training flag and parameters),
# so it is cached under that key and the probes run once, not every step.
# Probe values are then computed only if a later operation misses the
# cache (ensure_probe). A module whose output shapes change while that key
# stays the same (shapes driven by some Python attribute) would make the
# cached shapes wrong: each node filled from the cache is checked against
# what its first chunk returns (run/execute.py), and the stale entry is dropped.

_PROBE_CACHE_MAX = 4096
_probe_cache = {}


class _Uncacheable(Exception):
    pass


def probe_cache_get(key):
    if key is None:
        return None
    return _probe_cache.get(key)


def probe_cache_put(key, desc):
    if len(_probe_cache) >= _PROBE_CACHE_MAX:
        _probe_cache.clear()
    _probe_cache[key] = desc


def forget_probe(node):
    """Drop cache entries after a node's cached shapes proved wrong."""
    _probe_cache.clear()


_SCALARS = (int, float, bool, str, complex, type(None))


def _key_of(obj):
    t = type(obj)
    if t is Node:
        return ("N", obj.state, obj.bdims, obj.ragged, obj.shape, obj.interleaved,
                obj.dtype, obj.device, obj.requires_grad, obj.mixes is not None)
    if t is tuple or t is list:
        return (t is list, tuple(_key_of(o) for o in obj))
    if t is dict:
        return ("d", tuple((k, _key_of(v)) for k, v in obj.items()))
    if t is BatchInt:
        return ("B", obj.k)
    if t in _SCALARS:
        return (t, obj)
    if t is Sliced:
        return ("S", obj.dim, obj.k, tuple(obj.tensor.shape), obj.tensor.dtype,
                obj.tensor.device)
    if t is Arange:
        return ("A", obj.device, obj.dtype)
    if isinstance(obj, torch.Tensor):
        return ("T", tuple(obj.shape), obj.dtype, obj.device, obj.requires_grad)
    if isinstance(obj, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return obj
    if t is slice:
        return ("sl", _key_of(obj.start), _key_of(obj.stop), _key_of(obj.step))
    if obj is Ellipsis:
        return "..."
    if isinstance(obj, torch.Size):
        return ("z", tuple(obj))
    raise _Uncacheable


def probe_key(fn, module, targs, tkw, B, grad, autocast):
    try:
        if module is not None:
            fk = (id(module), type(module), module.training,
                  tuple((id(p), tuple(p.shape), p.dtype, p.requires_grad)
                        for p in module.parameters()),
                  tuple((id(b), tuple(b.shape), b.dtype) for b in module.buffers()))
        else:
            fk = fn
        key = (fk, B, grad, autocast, _key_of(targs), _key_of(tkw))
        hash(key)
        return key
    except (_Uncacheable, TypeError):
        return None
