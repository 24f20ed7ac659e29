"""Errors of memfit.lazy: LazyError, and the message for a computation that
mixes samples.
"""

import torch

__all__ = ["LazyError"]


OutOfMemoryError = torch.cuda.OutOfMemoryError


class LazyError(RuntimeError):
    """A computation on lazy tensors that memfit.lazy cannot run as asked."""


def mix_error(what, node_desc, fix=None):
    msg = (
        f"memfit.lazy: {what}{' (' + node_desc + ')' if node_desc else ''}: this mixes "
        f"samples across the batch dimension, so running it in chunks would give a "
        f"different result than on the whole batch. "
    )
    msg += fix or (
        "Pass allow_mixing=True to memfit.lazy() to run this computation whole (one "
        "chunk, as eager PyTorch would), or restructure it."
    )
    return LazyError(msg)


def inplace_error(what, node=None):
    """The error for an in-place change of a lazy tensor (of `node`)."""
    where = f" (the lazy tensor comes from {node.describe()})" if node is not None else ""
    return LazyError(
        f"memfit.lazy: {what} would modify a lazy tensor in place{where}. Lazy tensors "
        f"are recomputed chunk by chunk, so in-place changes are refused: write "
        f"x = x + ... (out of place), or modify the tensor before memfit.lazy()"
    )
