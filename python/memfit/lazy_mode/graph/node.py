"""Graph nodes, and the placeholders that recorded arguments hold for values
that follow the chunk (BatchInt, Sliced, Arange).
"""

import itertools

__all__ = ["BatchInt", "Node"]


class BatchInt(int):
    """An int equal to k times the batch size, as returned by x.size(d) or
    x.shape[d] of a lazy tensor whose dimension d holds k entries per sample.

    Where it is passed back into a recorded operation (x.view(x.size(0), -1))
    memfit replaces it by k times the chunk size, so shapes follow the chunk.
    Multiplying it by an int keeps the tag; any other arithmetic gives a
    plain int.
    """

    def __new__(cls, k, batch):
        self = int.__new__(cls, k * batch)
        self.k = k
        self.batch = batch
        return self

    def __mul__(self, other):
        if type(other) is int:
            return BatchInt(self.k * other, self.batch)
        if isinstance(other, BatchInt):
            return int(self) * int(other)
        return int.__mul__(self, other)

    __rmul__ = __mul__

    def __reduce__(self):
        return (int, (int(self),))


class Sliced:
    """A plain tensor that holds samples: narrowed with the chunk."""

    __slots__ = ("tensor", "dim", "k")

    def __init__(self, tensor, dim, k):
        self.tensor, self.dim, self.k = tensor, dim, k


class Arange:
    """torch.arange(batch) used as an index: becomes arange(chunk)."""

    __slots__ = ("device", "dtype")

    def __init__(self, device, dtype):
        self.device, self.dtype = device, dtype


_ids = itertools.count()


class Node:
    """One recorded step. kind: "leaf" (a tensor given to lazy()), "op" (a
    recorded call), "item" (one tensor of an op's tuple/list/dict result).

    Tensor-valued nodes carry: state ("batched": some dimension carries the
    batch; "reduced": computed from batched values but the batch is gone;
    "constant": no batched input; "eager": already computed, see `value`),
    bdims ((dim, k): dimension dim holds k entries per sample), ragged (dims
    whose size depends on the data), shape (the full shape; None where
    ragged), interleaved (a merged or ragged batch dimension whose entries
    are not grouped sample by sample), probe values, dtype/device. A leaf
    whose tensor stays on the host has to_device set (see placement.py).
    """

    __slots__ = (
        "id", "kind", "fn", "args", "kwargs", "parents", "name", "op", "where",
        "B", "state", "bdims", "ragged", "shape", "interleaved", "probe",
        "value", "grad", "autocast", "allow", "mixes", "wref", "parent", "path",
        "leaf_dim", "requires_grad", "dtype", "device", "rkind", "rinfo",
        "module", "cached", "to_device", "backward_done", "__weakref__",
    )

    def __init__(self, kind):
        self.id = next(_ids)
        self.kind = kind
        self.fn = None
        self.args = ()
        self.kwargs = {}
        self.parents = ()
        self.name = ""
        self.op = ""
        self.where = "?"
        self.B = None
        self.state = "constant"
        self.bdims = ()
        self.ragged = ()
        self.shape = None
        self.interleaved = False
        self.probe = ()
        self.value = None
        self.grad = True
        self.autocast = None
        self.allow = False
        self.mixes = None
        self.wref = None
        self.parent = None
        self.path = ()
        self.leaf_dim = None
        self.requires_grad = False
        self.dtype = None
        self.device = None
        self.rkind = None
        self.rinfo = None
        self.module = None
        self.cached = False
        self.to_device = None  # a leaf kept on the host: the device its chunks move to
        # A backward went through it without retain_graph: see Note [A second
        # backward through a lazy graph] (run/backward.py).
        self.backward_done = False

    def probe_at(self, i):
        p = self.probe
        return p[i] if i < len(p) else p[-1]

    def describe(self):
        return f"{self.name} (at {self.where})"

    def held(self):
        """True when the user still holds a lazy tensor for this node."""
        return self.wref is not None and self.wref() is not None

    def single_bdim(self):
        """(dim, k) when the batch sits in one dimension, grouped by sample."""
        if len(self.bdims) == 1 and not self.ragged and not self.interleaved:
            return self.bdims[0]
        return None

    def __repr__(self):
        return f"<Node {self.id} {self.kind} {self.name} {self.state}>"


def probe_sizes(B):
    """The numbers of samples the two probes of a batch of B run on."""
    if B is None or B <= 1:
        return ()
    if B >= 4:
        return (2, 3)
    return (1, 2)
