"""Walking and resizing the tensors of a batch: tensors, tuples, lists, dicts
and other mappings (Hugging Face's BatchEncoding)."""

import operator
from collections.abc import Mapping

import torch

__all__ = [
    "count", "map_tensors", "tensors_in", "first_batch_dim", "batch_size", "narrow_batch",
    "resize_batch",
]


def count(value, what, name, minimum=1):
    """`value` as an int >= `minimum`: a number of samples, steps or ranks.
    Integers (numpy's too) pass; bools and floats, even 8.0, are refused
    with a ValueError naming `what` and `name`."""
    try:
        n = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        n = None
    if n is None or n < minimum:
        raise ValueError(
            f"[{what}] {name} must be an int >= {minimum}, got {type(value).__name__} {value!r}"
        )
    return n


def map_tensors(obj, fn):
    """`obj` with `fn` applied to every tensor in it (nested tuple/list/dict,
    or another mapping such as a BatchEncoding)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(map_tensors(o, fn) for o in obj)
    if isinstance(obj, list):
        return [map_tensors(o, fn) for o in obj]
    if isinstance(obj, Mapping):
        items = {k: map_tensors(v, fn) for k, v in obj.items()}
        return items if isinstance(obj, dict) else _same_mapping(obj, items)
    return obj


def _same_mapping(obj, items):
    """`items` as a mapping of `obj`'s kind where its constructor takes a
    dict (BatchEncoding does: the step then gets what the user's loader
    gives), else as a dict."""
    try:
        return type(obj)(items)
    except Exception:  # noqa: BLE001 (any constructor that will not take a dict)
        return items


def tensors_in(obj):
    """Every tensor in `obj`, depth first."""
    found = []
    map_tensors(obj, lambda t: found.append(t) or t)
    return found


def _dims(obj, batch_dim, what):
    """(tensor, dim) for every tensor in `obj`, dim None for a tensor shared
    by every sample. `batch_dim` is an int for every tensor, or one entry
    per input: a tuple/list beside tuple/list inputs, a dict beside dict
    inputs; an entry is an int or None (shared) for everything in it."""
    if batch_dim is None or isinstance(batch_dim, (bool, int)):
        if batch_dim is None or isinstance(batch_dim, bool):
            raise ValueError(
                f"[{what}] batch_dim must be an int, or a tuple/dict with an int or None per "
                f"input, got {batch_dim!r}"
            )
        return [(t, batch_dim) for t in tensors_in(obj)]
    if isinstance(batch_dim, dict) and isinstance(obj, Mapping):
        keys = list(obj)
        entries = [batch_dim.get(k, 0) for k in keys]
        unknown = set(batch_dim) - set(keys)
        parts = [obj[k] for k in keys]
    elif isinstance(batch_dim, (tuple, list)) and isinstance(obj, (tuple, list)):
        entries, parts, unknown = list(batch_dim), list(obj), ()
        if len(entries) != len(parts):
            raise ValueError(
                f"[{what}] batch_dim has {len(entries)} entries but there are {len(parts)} "
                f"inputs: give one per input (an int, or None for an input shared by "
                f"every sample)"
            )
    else:
        raise ValueError(
            f"[{what}] a per-input batch_dim ({type(batch_dim).__name__}) needs inputs of the "
            f"same kind, got {type(obj).__name__}: pass an int, a tuple beside a tuple of "
            f"inputs, or a dict beside a dict"
        )
    if unknown:
        raise ValueError(f"[{what}] batch_dim names no such input: {sorted(unknown)}")
    out = []
    for part, d in zip(parts, entries):
        if d is not None and (isinstance(d, bool) or not isinstance(d, int)):
            raise ValueError(
                f"[{what}] each batch_dim entry must be an int or None (shared by every "
                f"sample), got {d!r}"
            )
        out += [(t, d) for t in tensors_in(part)]
    return out


def first_batch_dim(batch_dim):
    """The int among a per-input `batch_dim` that a target without its own
    batch_dim is batched along: the first that is not None (0 if none)."""
    if isinstance(batch_dim, int):
        return batch_dim
    entries = batch_dim.values() if isinstance(batch_dim, dict) else batch_dim
    return next((d for d in entries if d is not None), 0)


def batch_size(obj, batch_dim=0, what="inputs"):
    """The batch size shared by every tensor in `obj` but those shared by
    every sample (None in a per-input `batch_dim`, see _dims).

    Raises ValueError if there is no tensor, a tensor has no `batch_dim`, the
    batch is empty, or the tensors disagree.
    """
    dims = _dims(obj, batch_dim, what)
    if not dims:
        raise ValueError(
            f"[{what}] expected a tensor or a tuple/list/dict of tensors, "
            f"got {type(obj).__name__}"
        )
    sizes = {}
    for t, d in dims:
        if d is None:
            continue
        if t.dim() <= d or t.dim() < -d:
            raise ValueError(
                f"[{what}] batch dimension {d} is out of range for a "
                f"tensor of shape {tuple(t.shape)}: pass batch_dim= the "
                f"dimension that indexes samples"
            )
        sizes.setdefault(t.shape[d], tuple(t.shape))
    if not sizes:
        raise ValueError(
            f"[{what}] batch_dim marks every input as shared by every sample (None): "
            f"at least one must hold the samples"
        )
    if len(sizes) > 1:
        shapes = ", ".join(str(s) for s in sizes.values())
        raise ValueError(
            f"[{what}] the tensors disagree on the batch size along dimension "
            f"{batch_dim}: {sorted(sizes)} (shapes {shapes}); every input and target must "
            f"hold the same samples. An input shared by every sample (a mask or table "
            f"of shape (1, ...)) takes None in a per-input batch_dim, e.g. "
            f"batch_dim=(0, None)"
        )
    (size,) = sizes
    if size == 0:
        raise ValueError(f"[{what}] the batch is empty (0 samples along dimension {batch_dim})")
    return size


def _map_batched(obj, batch_dim, fn):
    """`obj` with fn(tensor, dim) applied to every tensor; dim None for a
    shared one (see _dims)."""
    dims = iter([d for _, d in _dims(obj, batch_dim, "batch")])
    return map_tensors(obj, lambda t: fn(t, next(dims)))


def narrow_batch(obj, start, n, batch_dim=0):
    """Samples [start, start + n) of `obj`, as views; shared tensors whole."""
    return _map_batched(obj, batch_dim,
                        lambda t, d: t if d is None else t.narrow(d, start, n))


def resize_batch(obj, n, batch_dim=0):
    """`obj` with `n` samples: the first n, or the samples repeated to n;
    tensors shared by every sample are copied as they are.

    Only shapes matter to memory, so repeating samples is a faithful probe.
    """

    def resize(t, d):
        if d is None:
            return t.clone()
        have = t.shape[d]
        if n <= have:
            return t.narrow(d, 0, n).clone()
        reps = -(-n // have)
        return torch.cat([t] * reps, dim=d).narrow(d, 0, n).clone()

    return _map_batched(obj, batch_dim, resize)
