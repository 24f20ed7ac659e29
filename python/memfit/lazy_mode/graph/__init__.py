"""Recording for memfit.lazy: the graph of Nodes, and what memfit learns
about each recorded operation before anything runs at full batch.

Every operation on a lazy tensor becomes a Node. When it is recorded, it is
also run on two small probes: the first p1 and the first p2 samples of every
lazy input (p1, p2 = 2, 3; 1, 2 for batches under 4). Comparing the two
results tells which output dimensions carry the batch (a dimension of size
k*p holds k entries per sample), the full shape, dtype and device, whether
the result needs gradients, and whether the operation mixes samples (the
batch vanished, appears twice, or does not scale). Errors surface at the
line that wrote the operation, not later at backward().

The probes are real: small tensors on the real device, so any operation,
module or custom kernel works without a meta or shape-inference rule.

This layer works on plain Nodes and imports neither lazy_mode.run nor the
LazyTensor above it (lazy_mode.tensor): what the user holds for a Node, and how a
full value is read, come in as RecordCallbacks.
"""

from .errors import LazyError
from .node import BatchInt, Node
from .recording import RecordCallbacks, make_leaf, record

__all__ = ["BatchInt", "LazyError", "Node", "RecordCallbacks", "make_leaf", "record"]
