"""The nn.Module.__call__ interception: a module called on lazy tensors is
recorded as one step (see Note [Module calls are recorded whole]).
"""

import torch

from ..graph.errors import OutOfMemoryError, mix_error
from ..graph.mixing import bdim_set
from ..graph.names import user_line
from .tensor import LazyTensor, recorded

__all__ = ["install_module_hook"]


_orig_module_call = None
_BN = torch.nn.modules.batchnorm._BatchNorm


def _any_lazy(args, kwargs):
    return _holds_lazy(args) or (bool(kwargs) and _holds_lazy(kwargs.values()))


def _holds_lazy(values):
    """True when a value, or an item of a tuple/list value, is a LazyTensor."""
    for a in values:
        t = type(a)
        if t is LazyTensor:
            return True
        if t is tuple or t is list:
            for b in a:
                if type(b) is LazyTensor:
                    return True
    return False


def install_module_hook():
    """Make nn.Module calls with lazy arguments record one step.

    Note [Module calls are recorded whole]: a module called on lazy tensors
    is recorded as a single step "call this module", and each chunk runs the
    module on real tensors. That keeps every module working exactly as
    written: LSTM/GRU (whose kernels do not go through __torch_function__),
    MultiheadAttention fast paths, ReLU(inplace=True), custom autograd
    Functions, TorchScript, data-dependent control flow. The price is that
    memfit sees the module only from outside: it checks its submodules for
    BatchNorm in training mode and its batch_first convention, and the
    shapes it returns, not the operations in its forward.

    This needs one interception: nn.Module.__call__ is wrapped, once, on the
    first memfit.lazy() call (not on import). The wrapper checks the
    positional and keyword arguments (one level into tuples/lists) for a
    LazyTensor and otherwise calls the original at once. torch's own loss
    modules (nn.CrossEntropyLoss, ...) are not recorded whole: their forward
    runs on the lazy tensors, so the F.*_loss call and its reduction are seen.
    """
    global _orig_module_call
    if _orig_module_call is not None:
        return
    orig = torch.nn.Module.__call__
    if getattr(orig, "memfit_wrapper", False):
        _orig_module_call = orig.memfit_orig
        return
    _orig_module_call = orig

    def __call__(self, *args, **kwargs):
        if _any_lazy(args, kwargs):
            return record_module_call(self, args, kwargs)
        return orig(self, *args, **kwargs)

    __call__.memfit_wrapper = True
    __call__.memfit_orig = orig
    __call__.__doc__ = orig.__doc__
    __call__.__wrapped__ = orig
    torch.nn.Module.__call__ = __call__


def _expected_batch_dim(module):
    """0 or 1 for modules whose inputs have a fixed batch dimension."""
    bf = getattr(module, "batch_first", None)
    if isinstance(module, (torch.nn.RNNBase, torch.nn.MultiheadAttention)):
        return 0 if bf else 1
    if isinstance(module, (torch.nn.TransformerEncoder, torch.nn.TransformerDecoder,
                           torch.nn.TransformerEncoderLayer,
                           torch.nn.TransformerDecoderLayer, torch.nn.Transformer)):
        if bf is None:
            for m in module.modules():
                if isinstance(m, torch.nn.MultiheadAttention):
                    bf = m.batch_first
                    break
        return 0 if bf else 1
    return None


def record_module_call(module, args, kwargs):
    """Record module(*args, **kwargs) with lazy arguments."""
    if type(module).__module__ == "torch.nn.modules.loss":
        return _orig_module_call(module, *args, **kwargs)
    first = None
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, LazyTensor):
            first = a.node
            break
    allow = any(isinstance(a, LazyTensor) and a.node.allow
                for a in list(args) + list(kwargs.values()))
    where = user_line()
    label = f"{type(module).__name__} at {where}"
    mixes = None
    batched = first is not None and first.state == "batched" and first.B and first.B >= 2
    if batched:
        for path, m in module.named_modules():
            if isinstance(m, _BN) and m.training:
                e = mix_error(
                    f"{type(m).__name__} {('at ' + repr(path)) if path else ''} in "
                    f"training mode (it normalizes with statistics of the whole batch)",
                    label,
                    "Call .eval() on BatchNorm layers, replace them with GroupNorm or "
                    "LayerNorm, or pass allow_mixing=True to memfit.lazy() to run the "
                    "step whole.")
                if not allow:
                    raise e
                mixes = str(e)
                break
        expect = _expected_batch_dim(module)
        if expect is not None and args and isinstance(args[0], LazyTensor):
            x = args[0].node
            ndim = len(x.shape)
            ok = bdim_set(x) == {expect} if ndim >= 3 else False
            if not ok:
                e = mix_error(
                    f"{type(module).__name__} reads dimension {expect} as the batch "
                    f"(batch_first={expect == 0}), but the lazy input's batch is in "
                    f"dimension(s) {sorted(bdim_set(x))} of shape {x.shape}", label,
                    "Pass the input with the batch where the module expects it, or "
                    "set batch_first to match.")
                if not allow:
                    raise e
                mixes = mixes or str(e)
    out = recorded(module, args, kwargs, name=type(module).__name__, module=module)
    if mixes:
        _mark_mixes(out, mixes)
    if batched and _has_reduced(out):
        # A module returning a value reduced over the batch (a custom loss):
        # record its forward step by step, so the reduction is known.
        try:
            return _orig_module_call(module, *args, **kwargs)
        except OutOfMemoryError:
            raise
        except Exception:
            return out
    return out


def _mark_mixes(out, why):
    if isinstance(out, LazyTensor):
        out.node.mixes = out.node.mixes or why
        if out.node.parent is not None:
            out.node.parent.mixes = out.node.parent.mixes or why
    elif isinstance(out, (tuple, list)):
        for o in out:
            _mark_mixes(o, why)
    elif isinstance(out, dict):
        for o in out.values():
            _mark_mixes(o, why)


def _has_reduced(out):
    if isinstance(out, LazyTensor):
        return out.node.state == "reduced"
    if isinstance(out, (tuple, list)):
        return any(_has_reduced(o) for o in out)
    if isinstance(out, dict):
        return any(_has_reduced(o) for o in out.values())
    return False
