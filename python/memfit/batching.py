"""Walking and resizing the tensors of a batch: tensors, tuples, lists, dicts."""

import operator

import torch


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
    """`obj` with `fn` applied to every tensor in it (nested tuple/list/dict)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(map_tensors(o, fn) for o in obj)
    if isinstance(obj, list):
        return [map_tensors(o, fn) for o in obj]
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj


def tensors_in(obj):
    """Every tensor in `obj`, depth first."""
    found = []
    map_tensors(obj, lambda t: found.append(t) or t)
    return found


def batch_size(obj, batch_dim=0, what="inputs"):
    """The batch size shared by every tensor in `obj`.

    Raises ValueError if there is no tensor, a tensor has no `batch_dim`, the
    batch is empty, or the tensors disagree.
    """
    tensors = tensors_in(obj)
    if not tensors:
        raise ValueError(
            f"[{what}] expected a tensor or a tuple/list/dict of tensors, "
            f"got {type(obj).__name__}"
        )
    sizes = set()
    for t in tensors:
        if t.dim() <= batch_dim or t.dim() < -batch_dim:
            raise ValueError(
                f"[{what}] batch dimension {batch_dim} is out of range for a "
                f"tensor of shape {tuple(t.shape)}: pass batch_dim= the "
                f"dimension that indexes samples"
            )
        sizes.add(t.shape[batch_dim])
    if len(sizes) > 1:
        raise ValueError(
            f"[{what}] the tensors disagree on the batch size along dimension "
            f"{batch_dim}: {sorted(sizes)}; every input and target must hold "
            f"the same samples"
        )
    (size,) = sizes
    if size == 0:
        raise ValueError(f"[{what}] the batch is empty (0 samples along dimension {batch_dim})")
    return size


def resize_batch(obj, n, batch_dim=0):
    """`obj` with `n` samples: the first n, or the samples repeated to n.

    Only shapes matter to memory, so repeating samples is a faithful probe.
    """

    def resize(t):
        have = t.shape[batch_dim]
        if n <= have:
            return t.narrow(batch_dim, 0, n).clone()
        reps = -(-n // have)
        return torch.cat([t] * reps, dim=batch_dim).narrow(batch_dim, 0, n).clone()

    return map_tensors(obj, resize)
