"""The lazy tensor layer of memfit.lazy: LazyTensor, the nn.Module call
interception, and the only place that wraps Nodes into lazy tensors and
unwraps them.

The lazy engine is three one-way layers:
- lazy_mode.graph: recording on plain Nodes (probes, mixing checks, templates);
  it imports neither of the layers above.
- lazy_mode.run: reading values and the chunked backward, on Nodes; it imports
  the graph only.
- lazy_mode.tensor (this package): what user code holds, a LazyTensor standing
  for a Node; torch calls on it are recorded (graph) and computed (run).
"""

from .module_hook import install_module_hook
from .tensor import LazyTensor, lazy_leaf

__all__ = ["LazyTensor", "install_module_hook", "lazy_leaf"]
