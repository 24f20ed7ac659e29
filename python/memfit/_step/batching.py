"""Walking and resizing the tensors of a batch: tensors, tuples, lists, dicts
and other mappings (Hugging Face's BatchEncoding), NamedTuples and
dataclasses."""

import dataclasses
import operator
from collections.abc import Mapping

import torch

__all__ = ["count", "sequence_length"]


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
    another mapping such as a BatchEncoding, a NamedTuple or a dataclass:
    each of the kind the user's loader gave)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        items = [map_tensors(o, fn) for o in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: map_tensors(getattr(obj, f.name), fn)
                                           for f in dataclasses.fields(obj) if f.init})
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


def target_batch_dim_of(batch_dim, target_batch_dim=None, what="profile"):
    """The dimension the target is batched along: target_batch_dim where
    given (an int >= 0), else first_batch_dim(batch_dim)."""
    if target_batch_dim is None:
        return first_batch_dim(batch_dim)
    if isinstance(target_batch_dim, bool) or not isinstance(target_batch_dim, int) \
            or target_batch_dim < 0:
        raise ValueError(f"[{what}] target_batch_dim must be an int >= 0 (the target's "
                         f"dimension that indexes samples), got {target_batch_dim!r}")
    return target_batch_dim


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


def check_samples(inputs, target, batch_dim, target_dim, what):
    """The inputs' batch size; raises ValueError tagged `what` (the
    operation the user called) where `target`, cut along `target_dim`,
    does not hold the same samples."""
    b = batch_size(inputs, batch_dim, what)
    if target is None:
        return b
    lowest = min((t.dim() for t in tensors_in(target)), default=target_dim + 1)
    # A (batch,) target beside seq-first inputs (T, batch, ...).
    if target_dim > 0 and target_dim >= lowest:
        raise ValueError(
            f"[{what}] the target is cut along dimension {target_dim} (batch_dim's first, "
            f"unless target_batch_dim= says), which a target of {lowest} dimension(s) does "
            f"not have: pass target_batch_dim=0 for a target batched along its first "
            f"dimension (a (batch,) label beside seq-first inputs)")
    tb = batch_size(target, target_dim, f"{what} target")
    if tb != b:
        raise ValueError(f"[{what}] inputs hold {b} samples but target holds {tb}: they must "
                         f"hold the same samples")
    return b


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

    Repeating samples keeps the shapes and the example's values: faithful
    where memory follows shapes, not where it follows values (See Note
    [Memory that depends on the batch's values], op_frames.h).
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


def _length_dims(obj, seq_dim, what):
    """(tensor, dim) for every tensor in `obj`, dim None for a tensor with no
    length. `seq_dim` as batch_dim (see _dims): an int for every tensor, or
    one entry per input (a tuple/list beside a tuple/list, a dict beside a
    dict), each an int or None. Under an int, a tensor with too few
    dimensions has no length (a class label of shape (B,))."""
    if isinstance(seq_dim, bool) or seq_dim is None:
        raise ValueError(f"[{what}] seq_dim must be an int, or a tuple/dict with an int or None "
                         f"per input, got {seq_dim!r}")
    if isinstance(seq_dim, int):
        return [(t, seq_dim if -t.dim() <= seq_dim < t.dim() else None) for t in tensors_in(obj)]
    if isinstance(seq_dim, dict) and isinstance(obj, Mapping):
        unknown = set(seq_dim) - set(obj)
        if unknown:
            raise ValueError(f"[{what}] seq_dim names no such input: {sorted(unknown)}")
        pairs = [(obj[k], seq_dim.get(k)) for k in obj]
    elif isinstance(seq_dim, (tuple, list)) and isinstance(obj, (tuple, list)):
        if len(seq_dim) != len(obj):
            raise ValueError(f"[{what}] seq_dim has {len(seq_dim)} entries but there are "
                             f"{len(obj)} inputs: give one per input (an int, or None for an "
                             f"input without a length)")
        pairs = list(zip(obj, seq_dim))
    else:
        raise ValueError(f"[{what}] a per-input seq_dim ({type(seq_dim).__name__}) needs inputs "
                         f"of the same kind, got {type(obj).__name__}")
    out = []
    for part, d in pairs:
        if d is not None and (isinstance(d, bool) or not isinstance(d, int)):
            raise ValueError(f"[{what}] each seq_dim entry must be an int or None (no length), "
                             f"got {d!r}")
        for t in tensors_in(part):
            if d is not None and not -t.dim() <= d < t.dim():
                raise ValueError(f"[{what}] seq_dim {d} is out of range for a tensor of shape "
                                 f"{tuple(t.shape)}")
            out.append((t, d))
    return out


def sequence_length(obj, seq_dim, what="inputs"):
    """The length shared along `seq_dim` by the tensors of `obj` that have
    one (see _length_dims). Raises ValueError when none has a length, or
    they disagree."""
    sizes = {}
    for t, d in _length_dims(obj, seq_dim, what):
        if d is not None:
            sizes.setdefault(t.shape[d], tuple(t.shape))
    if not sizes:
        raise ValueError(f"[{what}] no tensor has a dimension {seq_dim!r} (seq_dim): pass the "
                         f"dimension that indexes tokens, e.g. seq_dim=1 for (batch, length)")
    if len(sizes) > 1:
        shapes = ", ".join(str(s) for s in sizes.values())
        if isinstance(obj, Mapping):  # a dict beside a dict batch
            key = next(iter(obj))
            how = (f"a dict naming the inputs that have a length, e.g. seq_dim={{{key!r}: "
                   f"{seq_dim if isinstance(seq_dim, int) else 1}}} (a key left out has none)")
        else:
            how = "None for an input without a length in a per-input seq_dim, e.g. (1, None)"
        raise ValueError(f"[{what}] the tensors disagree on the length along seq_dim "
                         f"{seq_dim!r}: {sorted(sizes)} (shapes {shapes}); give {how}")
    (length,) = sizes
    if length == 0:
        raise ValueError(f"[{what}] the example is empty along seq_dim {seq_dim!r}")
    return length


def resize_length(obj, n, seq_dim, length, what="inputs"):
    """`obj` with every tensor that is `length` long along its seq_dim (see
    _length_dims) cut to its first `n` positions, or repeated to n; other
    tensors as they are. A repeated sequence is a faithful probe of a longer
    one where memory follows shapes (See Note [Memory that depends on the
    batch's values], op_frames.h). The target of a token-level loss
    (labels of shape (batch, length)) is resized with its inputs this way;
    a class label of shape (batch,) is left alone."""

    def resize(t, d):
        if d is None or t.shape[d] != length:
            return t
        if n <= length:
            return t.narrow(d, 0, n).clone()
        return torch.cat([t] * -(-n // length), dim=d).narrow(d, 0, n).clone()

    dims = iter([d for _, d in _length_dims(obj, seq_dim, what)])
    return map_tensors(obj, lambda t: resize(t, next(dims)))
