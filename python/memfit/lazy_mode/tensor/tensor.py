"""The lazy tensor: metadata known from the probes, values computed when
needed, and torch functions, methods and operators recorded on its Node.

The only place that wraps and unwraps: a LazyTensor holds a Node of the
graph layer (..graph); its arguments reach record() as Nodes (unwrap) and
the Nodes recorded come back as LazyTensors (RecordCallbacks.hold); values
and gradients are computed by the run layer (..run) on the Node.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from ..graph.errors import LazyError, inplace_error
from ..graph.names import display_name
from ..graph.node import BatchInt, Node
from ..graph.probe import ensure_probe
from ..graph.recording import RecordCallbacks, make_leaf, record
from ..run.backward import backward as run_backward
from ..run.values import read

__all__ = ["LazyTensor", "lazy_leaf"]


class LazyTensor:
    """A tensor whose computation is recorded, not run (see memfit.lazy).

    Torch functions, tensor methods and operators, and module calls on it
    return lazy tensors. Shapes, dtype and device are known at once; values
    are computed, in chunks that fit, by backward(), item(), tolist(),
    numpy(), bool()/float()/int(), printing, or memfit.eager().
    """

    __slots__ = ("_node", "__weakref__")
    __hash__ = object.__hash__
    __array_priority__ = 1000

    def __init__(self, node: Node) -> None:
        self._node = node
        node.wref = weakref.ref(self)

    @property
    def node(self) -> Node:
        """The recorded Node this lazy tensor stands for."""
        return self._node

    # isinstance(x, torch.Tensor) is True for a lazy tensor, as code written
    # for tensors expects (GradScaler.scale multiplies a Tensor but iterates
    # anything else); type(x) stays LazyTensor. See Note [A lazy tensor is a Tensor].
    @property
    def __class__(self):
        return torch.Tensor

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        special = _TORCH_FUNCTION_SPECIAL.get(func)
        if special is not None:
            return special(*args, **(kwargs or {}))
        return recorded(func, args, kwargs or {})

    # -- metadata, known without running -------------------------------------

    @property
    def shape(self) -> torch.Size:
        """The full shape; batch sizes are BatchInts (see memfit.lazy)."""
        return self.size()

    def size(self, dim: int | None = None) -> Any:
        """Like Tensor.size(): the full shape, or one dimension's size."""
        n = self._node
        if n.state == "eager":
            return n.value.size() if dim is None else n.value.size(dim)
        if dim is not None:
            d = dim + len(n.shape) if dim < 0 else dim
            if not 0 <= d < len(n.shape):
                raise IndexError(
                    f"Dimension out of range (expected to be in range of "
                    f"[{-len(n.shape)}, {len(n.shape) - 1}], but got {dim})"
                )
            return self._dim_size(d)
        return torch.Size([self._dim_size(d) for d in range(len(n.shape))])

    def _dim_size(self, d):
        n = self._node
        if d in n.ragged:
            raise LazyError(
                f"memfit.lazy: dimension {d} of the result of {n.describe()} has a size "
                f"that depends on the data; it is known only once computed: use "
                f"memfit.eager(t).shape"
            )
        for dim, k in n.bdims:
            if dim == d:
                return BatchInt(k, n.B)
        return n.shape[d]

    def dim(self) -> int:
        """Number of dimensions."""
        n = self._node
        return n.value.dim() if n.state == "eager" else len(n.shape)

    ndimension = dim

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return self.dim()

    def numel(self) -> Any:
        """Number of elements of the full tensor."""
        n = self._node
        if n.state == "eager":
            return n.value.numel()
        out = 1
        for d in range(len(n.shape)):
            out *= int(self._dim_size(d))
        return out

    nelement = numel

    def __len__(self):
        if self.dim() == 0:
            raise TypeError("len() of a 0-d tensor")
        return int(self.size(0))

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the result (from the probes)."""
        return self._node.dtype

    @property
    def device(self) -> torch.device:
        """The device of the result (from the probes)."""
        return self._node.device

    @property
    def is_cuda(self) -> bool:
        """True when the result lives on a CUDA device."""
        return self._node.device.type == "cuda"

    @property
    def requires_grad(self) -> bool:
        """True when the result will need gradients."""
        return self._node.requires_grad

    @property
    def is_leaf(self) -> bool:
        """True for a lazy input, or a result that needs no gradient."""
        n = self._node
        return n.kind == "leaf" or not n.requires_grad

    @property
    def grad(self) -> None:
        """The gradient of a lazy input's tensor (None for computed ones)."""
        n = self._node
        if n.kind == "leaf":
            return n.value.grad
        return None

    @property
    def grad_fn(self) -> None:
        """None: a lazy tensor has no autograd graph until computed."""
        return None

    @property
    def is_nested(self) -> bool:
        """False: nested tensors are not supported lazily."""
        return False

    @property
    def layout(self) -> torch.layout:
        """The layout of the result."""
        return self._sample().layout

    @property
    def is_sparse(self) -> bool:
        """True for a sparse result."""
        return self._sample().is_sparse

    @property
    def is_quantized(self) -> bool:
        """True for a quantized result."""
        return self._sample().is_quantized

    @property
    def is_meta(self) -> bool:
        """True for a result on the meta device."""
        return self._node.device.type == "meta"

    @property
    def data(self) -> LazyTensor:
        """The result detached from autograd (lazy, like detach())."""
        return self.detach()

    @property
    def T(self) -> LazyTensor:
        """The transpose (lazy), like Tensor.T."""
        return recorded(_prop_T, (self,), {})

    @property
    def mT(self) -> LazyTensor:
        """The matrix transpose (lazy), like Tensor.mT."""
        return recorded(_prop_mT, (self,), {})

    def _sample(self):
        n = self._node
        if n.state == "eager":
            return n.value
        ensure_probe(n)
        return n.probe_at(0)

    def is_floating_point(self) -> bool:
        """True for a floating-point dtype."""
        return self._node.dtype.is_floating_point

    def is_complex(self) -> bool:
        """True for a complex dtype."""
        return self._node.dtype.is_complex

    def is_signed(self) -> bool:
        """True for a signed dtype."""
        return self._sample().is_signed()

    def element_size(self) -> int:
        """Bytes per element."""
        return self._sample().element_size()

    def is_contiguous(self, memory_format: torch.memory_format = torch.contiguous_format) -> bool:
        """Whether a chunk's result is contiguous (from the probes)."""
        return self._sample().is_contiguous(memory_format=memory_format)

    def get_device(self) -> int:
        """The CUDA device index, or -1 on CPU."""
        return self._sample().get_device()

    def type(self, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        """The type string, or (with a dtype) a lazy conversion."""
        if dtype is None:
            return self._sample().type()
        return recorded(torch.Tensor.type, (self, dtype, non_blocking), kwargs)

    def stride(self, dim: int | None = None) -> Any:
        """Refused: strides are known only once computed."""
        raise LazyError(
            "memfit.lazy: the strides of a lazy tensor are known only once it is "
            "computed: use memfit.eager(t).stride()"
        )

    def data_ptr(self) -> int:
        """Refused: a lazy tensor has no memory yet."""
        raise LazyError(
            "memfit.lazy: a lazy tensor has no memory yet: use memfit.eager(t).data_ptr()"
        )

    def register_hook(self, hook: Callable) -> Any:
        """Refused: hooks on lazy tensors are not supported."""
        raise LazyError(
            "memfit.lazy: hooks on lazy tensors are not supported: register the hook "
            "on a module, or on memfit.eager(t)"
        )

    def retain_grad(self) -> None:
        """Refused: a lazy tensor keeps no .grad."""
        raise LazyError(
            "memfit.lazy: a lazy tensor is recomputed chunk by chunk and keeps no .grad; "
            "register a hook on a module instead"
        )

    def requires_grad_(self, requires_grad: bool = True) -> LazyTensor:
        """Refused: it would modify the lazy tensor in place."""
        raise LazyError(
            "memfit.lazy: requires_grad_() would modify a lazy tensor in place: call it "
            "on the tensor before memfit.lazy()"
        )

    # -- computing values -----------------------------------------------------

    def backward(self, gradient: Any = None, retain_graph: bool | None = None,
                 create_graph: bool = False, inputs: Any = None) -> None:
        """Compute the recorded computation chunk by chunk and accumulate the
        gradients of the full batch into the leaves' .grad (see memfit.lazy)."""
        if isinstance(inputs, LazyTensor):
            inputs = [inputs]
        if inputs is not None and not isinstance(inputs, torch.Tensor):
            inputs = [i.node.value if type(i) is LazyTensor else i for i in inputs]
        if type(gradient) is LazyTensor:
            gradient = gradient.node
        run_backward(self._node, gradient, retain_graph, create_graph, inputs)

    def item(self) -> Any:
        """The value of a one-element lazy tensor (computes it once)."""
        return self._value().item()

    def tolist(self) -> Any:
        """The values as nested lists (computes them once)."""
        return self._value().tolist()

    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        """The values as a NumPy array (computes them once)."""
        return self._value().detach().numpy(*args, **kwargs)

    def __array__(self, dtype=None):
        a = self._value().detach().cpu().numpy()
        return a if dtype is None else a.astype(dtype)

    def _value(self):
        return read(self._node)

    def __bool__(self):
        return bool(self._value())

    def __int__(self):
        return int(self._value())

    def __float__(self):
        return float(self._value())

    def __complex__(self):
        return complex(self._value())

    def __index__(self):
        return self._value().__index__()

    def __format__(self, spec):
        return self._value().__format__(spec)

    def __repr__(self):
        try:
            return repr(self._value())
        except Exception as e:  # repr must not raise in debuggers
            return f"<memfit LazyTensor {self._node.name}: not computable ({e})>"

    __str__ = __repr__

    def __iter__(self):
        n = self._node
        if n.state == "eager":
            return iter(n.value)
        if self.dim() == 0:
            raise TypeError("iteration over a 0-d tensor")
        if any(d == 0 for d, _ in n.bdims) or 0 in n.ragged:
            return iter(self._value())  # dimension 0 holds the samples
        return iter(recorded(torch.Tensor.unbind, (self, 0), {}))

    def __contains__(self, item):
        return item in self._value()

    def __reversed__(self):
        return reversed(self._value())

    # -- in-place operations are refused --------------------------------------

    def __setitem__(self, key, value):
        raise _inplace_error("x[...] = value", self)

    def __delitem__(self, key):
        raise _inplace_error("del x[...]", self)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(torch.Tensor, name, None)
        if attr is None:
            raise AttributeError(f"'LazyTensor' object has no attribute {name!r}")
        if name.endswith("_") and not name.startswith("_"):
            raise _inplace_error(f"Tensor.{name}()", self)
        if callable(attr):
            return _Method(self, attr)
        # a property (real, imag, H, ...): compute it as an operation
        getter = _property_getter(name)
        return recorded(getter, (self,), {})

    def __dir__(self):
        return sorted(set(dir(type(self))) | set(dir(torch.Tensor)))


# Note [A lazy tensor is a Tensor]: libraries check isinstance(x, torch.Tensor)
# before they operate on x (GradScaler.scale, clip_grad_norm_, loggers). A
# LazyTensor is not a torch.Tensor subclass (a subclass would have storage,
# and every operation would need a rule), so its __class__ answers
# torch.Tensor: isinstance() consults __class__ when the type itself does not
# match, and torch.Tensor's metaclass defines no __instancecheck__ of its own.
# Operations then reach __torch_function__ and are recorded. memfit's own code
# tells lazy from plain with type(x) is LazyTensor, or isinstance(x,
# LazyTensor) checked first.


class _Method:
    __slots__ = ("obj", "fn")

    def __init__(self, obj, fn):
        self.obj, self.fn = obj, fn

    def __call__(self, *args, **kwargs):
        return recorded(self.fn, (self.obj,) + args, kwargs)

    def __repr__(self):
        return f"<lazy method {display_name(self.fn)}>"


def _prop_T(t):
    return t.T


_prop_T.memfit_op = "T"
_prop_T.memfit_display = "Tensor.T"


def _prop_mT(t):
    return t.mT


_prop_mT.memfit_op = "mT"
_prop_mT.memfit_display = "Tensor.mT"

_PROPERTY_GETTERS = {}


def _property_getter(name):
    g = _PROPERTY_GETTERS.get(name)
    if g is None:

        def g(t):
            return getattr(t, name)

        g.memfit_op = name
        g.memfit_display = f"Tensor.{name}"
        _PROPERTY_GETTERS[name] = g
    return g


def _binary(fn):
    def method(self, other):
        return recorded(fn, (self, other), {})

    method.__name__ = fn.__name__
    return method


def _unary(fn):
    def method(self):
        return recorded(fn, (self,), {})

    method.__name__ = fn.__name__
    return method


for _n in (
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
    "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__",
    "__rmod__", "__pow__", "__rpow__", "__matmul__", "__rmatmul__", "__and__",
    "__rand__", "__or__", "__ror__", "__xor__", "__rxor__", "__lshift__",
    "__rshift__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
    "__getitem__",
):
    setattr(LazyTensor, _n, _binary(getattr(torch.Tensor, _n)))
for _n in ("__neg__", "__pos__", "__abs__", "__invert__"):
    setattr(LazyTensor, _n, _unary(getattr(torch.Tensor, _n)))


def _inplace_method(dunder):
    def method(self, other):
        raise _inplace_error(f"x {_AUG[dunder]} ...", self)

    return method


_AUG = {
    "__iadd__": "+=", "__isub__": "-=", "__imul__": "*=", "__itruediv__": "/=",
    "__ifloordiv__": "//=", "__imod__": "%=", "__ipow__": "**=", "__imatmul__": "@=",
    "__iand__": "&=", "__ior__": "|=", "__ixor__": "^=", "__ilshift__": "<<=",
    "__irshift__": ">>=",
}
for _n in _AUG:
    setattr(LazyTensor, _n, _inplace_method(_n))


def _inplace_error(what, obj=None):
    return inplace_error(what, obj.node if isinstance(obj, LazyTensor) else None)


# torch functions that must answer from the lazy tensor itself
_TORCH_FUNCTION_SPECIAL = {
    torch.Tensor.size: lambda self, *a, **k: self.size(*a, **k),
    torch.Tensor.dim: lambda self: self.dim(),
    torch.Tensor.numel: lambda self: self.numel(),
    torch.numel: lambda self: self.numel(),
    torch.Tensor.backward: lambda self, *a, **k: self.backward(*a, **k),
    torch.Tensor.item: lambda self: self.item(),
    torch.Tensor.tolist: lambda self: self.tolist(),
    torch.Tensor.__bool__: lambda self: self.__bool__(),
    torch.Tensor.__len__: lambda self: self.__len__(),
    torch.Tensor.__repr__: lambda self, *a, **k: repr(self),
    torch.Tensor.__format__: lambda self, spec: self.__format__(spec),
    torch.Tensor.register_hook: lambda self, hook: self.register_hook(hook),
}


def _special_setitem(self, key, value):
    target = self if isinstance(self, LazyTensor) else value
    raise _inplace_error("x[...] = value", target if isinstance(target, LazyTensor) else None)


_TORCH_FUNCTION_SPECIAL[torch.Tensor.__setitem__] = _special_setitem


def unwrap(obj):
    """obj with each LazyTensor replaced by its Node, in the tuples, lists
    and dicts that record() looks into (see scan_args)."""
    t = type(obj)
    if t is LazyTensor:
        return obj.node
    if t is tuple or t is list:
        out = [unwrap(o) for o in obj]
        return out if t is list else tuple(out)
    if t is dict:
        return {k: unwrap(v) for k, v in obj.items()}
    return obj


# What the graph layer gives back for a recorded Node, and how it reads a
# full value (see RecordCallbacks).
_CALLBACKS = RecordCallbacks(hold=LazyTensor, read=read)


def recorded(fn, args, kwargs, name=None, module=None):
    """Record fn(*args, **kwargs) on lazy tensors: the lazy result (or, for
    operations returning plain Python values, the value)."""
    return record(fn, unwrap(args), unwrap(kwargs), _CALLBACKS, name=name, module=module)


def lazy_leaf(tensor, batch, allow, device=None):
    """The lazy tensor for a tensor given to memfit.lazy() (see make_leaf)."""
    return LazyTensor(make_leaf(tensor, batch, allow, device))
