"""Recording for memfit.lazy: the lazy tensor, its graph, and what memfit
learns about each recorded operation before anything runs at full batch.

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
"""

import inspect
import itertools
import os
import sys
import weakref

import torch
import torch.nn.functional as F

OutOfMemoryError = torch.cuda.OutOfMemoryError


class LazyError(RuntimeError):
    """A computation on lazy tensors that memfit.lazy cannot run as asked."""


# ---------------------------------------------------------------------------
# Helpers: names, source locations, batch-size ints


_SKIP_DIRS = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
)


def _where():
    """file:line of the user code that recorded the current operation."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(_SKIP_DIRS):
        f = f.f_back
    if f is None:
        return "?"
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"


_REFLECTED = {
    "radd": "add", "rmul": "mul", "rand": "and", "ror": "or", "rxor": "xor",
    "rtruediv": "rdiv", "rdiv": "rdiv", "rsub": "rsub", "rpow": "rpow",
    "rmatmul": "rmatmul", "rfloordiv": "rfloordiv", "rmod": "rmod",
    "truediv": "div", "floordiv": "floor_divide", "mod": "remainder",
    "pos": "positive",
}

_INPLACE_DUNDERS = {
    "iadd", "isub", "imul", "itruediv", "idiv", "ifloordiv", "imod", "ipow",
    "imatmul", "iand", "ior", "ixor", "ilshift", "irshift", "setitem",
    "delitem",
}


def op_name(fn):
    """Normalised name of a torch function, for classification."""
    n = getattr(fn, "_memfit_op", None) or getattr(fn, "__name__", "") or ""
    if n.startswith("__") and n.endswith("__"):
        n = n[2:-2]
        n = _REFLECTED.get(n, n)
    return n


def display_name(fn):
    """How an operation is named in messages: Tensor.softmax, torch.cat, F.relu."""
    if isinstance(fn, torch.nn.Module):
        return type(fn).__name__
    name = getattr(fn, "_memfit_display", None)
    if name:
        return name
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    mod = getattr(fn, "__module__", None) or ""
    head, _, tail = qual.rpartition(".")
    if head in ("_TensorBase", "Tensor", "TensorBase"):
        return f"Tensor.{tail}"
    if head == "_VariableFunctionsClass" or mod == "torch":
        return f"torch.{tail}"
    if mod == "torch.nn.functional":
        return f"F.{qual}"
    if mod.startswith("torch"):
        return f"{mod}.{qual}"
    return qual


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


# ---------------------------------------------------------------------------
# Nodes

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
    are not grouped sample by sample), probe values, dtype/device.
    """

    __slots__ = (
        "id", "kind", "fn", "args", "kwargs", "parents", "name", "op", "where",
        "B", "state", "bdims", "ragged", "shape", "interleaved", "probe",
        "value", "grad", "autocast", "allow", "mixes", "wref", "parent", "path",
        "leaf_dim", "requires_grad", "dtype", "device", "rkind", "rinfo",
        "module", "cached", "__weakref__",
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


# ---------------------------------------------------------------------------
# The lazy tensor


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

    def __init__(self, node):
        self._node = node
        node.wref = weakref.ref(self)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        special = _TORCH_FUNCTION_SPECIAL.get(func)
        if special is not None:
            return special(*args, **(kwargs or {}))
        return record(func, args, kwargs or {})

    # -- metadata, known without running -------------------------------------

    @property
    def shape(self):
        """The full shape; batch sizes are BatchInts (see memfit.lazy)."""
        return self.size()

    def size(self, dim=None):
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

    def dim(self):
        """Number of dimensions."""
        n = self._node
        return n.value.dim() if n.state == "eager" else len(n.shape)

    ndimension = dim

    @property
    def ndim(self):
        """The number of dimensions."""
        return self.dim()

    def numel(self):
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
    def dtype(self):
        """The dtype of the result (from the probes)."""
        return self._node.dtype

    @property
    def device(self):
        """The device of the result (from the probes)."""
        return self._node.device

    @property
    def is_cuda(self):
        """True when the result lives on a CUDA device."""
        return self._node.device.type == "cuda"

    @property
    def requires_grad(self):
        """True when the result will need gradients."""
        return self._node.requires_grad

    @property
    def is_leaf(self):
        """True for a lazy input, or a result that needs no gradient."""
        n = self._node
        return n.kind == "leaf" or not n.requires_grad

    @property
    def grad(self):
        """The gradient of a lazy input's tensor (None for computed ones)."""
        n = self._node
        if n.kind == "leaf":
            return n.value.grad
        return None

    @property
    def grad_fn(self):
        """None: a lazy tensor has no autograd graph until computed."""
        return None

    @property
    def is_nested(self):
        """False: nested tensors are not supported lazily."""
        return False

    @property
    def layout(self):
        """The layout of the result."""
        return self._sample().layout

    @property
    def is_sparse(self):
        """True for a sparse result."""
        return self._sample().is_sparse

    @property
    def is_quantized(self):
        """True for a quantized result."""
        return self._sample().is_quantized

    @property
    def is_meta(self):
        """True for a result on the meta device."""
        return self._node.device.type == "meta"

    @property
    def data(self):
        """The result detached from autograd (lazy, like detach())."""
        return self.detach()

    @property
    def T(self):
        """The transpose (lazy), like Tensor.T."""
        return record(_prop_T, (self,), {})

    @property
    def mT(self):
        """The matrix transpose (lazy), like Tensor.mT."""
        return record(_prop_mT, (self,), {})

    def _sample(self):
        n = self._node
        if n.state == "eager":
            return n.value
        ensure_probe(n)
        return n.probe_at(0)

    def is_floating_point(self):
        """True for a floating-point dtype."""
        return self._node.dtype.is_floating_point

    def is_complex(self):
        """True for a complex dtype."""
        return self._node.dtype.is_complex

    def is_signed(self):
        """True for a signed dtype."""
        return self._sample().is_signed()

    def element_size(self):
        """Bytes per element."""
        return self._sample().element_size()

    def is_contiguous(self, memory_format=torch.contiguous_format):
        """Whether a chunk's result is contiguous (from the probes)."""
        return self._sample().is_contiguous(memory_format=memory_format)

    def get_device(self):
        """The CUDA device index, or -1 on CPU."""
        return self._sample().get_device()

    def type(self, dtype=None, non_blocking=False, **kwargs):
        """The type string, or (with a dtype) a lazy conversion."""
        if dtype is None:
            return self._sample().type()
        return record(torch.Tensor.type, (self, dtype, non_blocking), kwargs)

    def stride(self, dim=None):
        """Refused: strides are known only once computed."""
        raise LazyError(
            "memfit.lazy: the strides of a lazy tensor are known only once it is "
            "computed: use memfit.eager(t).stride()"
        )

    def data_ptr(self):
        """Refused: a lazy tensor has no memory yet."""
        raise LazyError(
            "memfit.lazy: a lazy tensor has no memory yet: use memfit.eager(t).data_ptr()"
        )

    def register_hook(self, hook):
        """Refused: hooks on lazy tensors are not supported."""
        raise LazyError(
            "memfit.lazy: hooks on lazy tensors are not supported: register the hook "
            "on a module, or on memfit.eager(t)"
        )

    def retain_grad(self):
        """Refused: a lazy tensor keeps no .grad."""
        raise LazyError(
            "memfit.lazy: a lazy tensor is recomputed chunk by chunk and keeps no .grad; "
            "register a hook on a module instead"
        )

    def requires_grad_(self, requires_grad=True):
        """Refused: it would modify the lazy tensor in place."""
        raise LazyError(
            "memfit.lazy: requires_grad_() would modify a lazy tensor in place: call it "
            "on the tensor before memfit.lazy()"
        )

    # -- computing values -----------------------------------------------------

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """Compute the recorded computation chunk by chunk and accumulate the
        gradients of the full batch into the leaves' .grad (see memfit.lazy)."""
        from .lazy_run import backward

        backward(self._node, gradient, retain_graph, create_graph, inputs)

    def item(self):
        """The value of a one-element lazy tensor (computes it once)."""
        return self._value().item()

    def tolist(self):
        """The values as nested lists (computes them once)."""
        return self._value().tolist()

    def numpy(self, *args, **kwargs):
        """The values as a NumPy array (computes them once)."""
        return self._value().detach().numpy(*args, **kwargs)

    def __array__(self, dtype=None):
        a = self._value().detach().cpu().numpy()
        return a if dtype is None else a.astype(dtype)

    def _value(self):
        from .lazy_run import read

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
        return iter(record(torch.Tensor.unbind, (self, 0), {}))

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
        return record(getter, (self,), {})

    def __dir__(self):
        return sorted(set(dir(type(self))) | set(dir(torch.Tensor)))


class _Method:
    __slots__ = ("obj", "fn")

    def __init__(self, obj, fn):
        self.obj, self.fn = obj, fn

    def __call__(self, *args, **kwargs):
        return record(self.fn, (self.obj,) + args, kwargs)

    def __repr__(self):
        return f"<lazy method {display_name(self.fn)}>"


def _prop_T(t):
    return t.T


_prop_T._memfit_op = "T"
_prop_T._memfit_display = "Tensor.T"


def _prop_mT(t):
    return t.mT


_prop_mT._memfit_op = "mT"
_prop_mT._memfit_display = "Tensor.mT"

_PROPERTY_GETTERS = {}


def _property_getter(name):
    g = _PROPERTY_GETTERS.get(name)
    if g is None:

        def g(t):
            return getattr(t, name)

        g._memfit_op = name
        g._memfit_display = f"Tensor.{name}"
        _PROPERTY_GETTERS[name] = g
    return g


def _binary(fn):
    def method(self, other):
        return record(fn, (self, other), {})

    method.__name__ = fn.__name__
    return method


def _unary(fn):
    def method(self):
        return record(fn, (self,), {})

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
    where = ""
    if isinstance(obj, LazyTensor):
        where = f" (the lazy tensor comes from {obj._node.describe()})"
    return LazyError(
        f"memfit.lazy: {what} would modify a lazy tensor in place{where}. Lazy tensors "
        f"are recomputed chunk by chunk, so in-place changes are refused: write "
        f"x = x + ... (out of place), or modify the tensor before memfit.lazy()"
    )


# ---------------------------------------------------------------------------
# Classification tables

_POINTWISE = {
    "add", "sub", "rsub", "mul", "div", "true_divide", "rdiv", "floor_divide",
    "rfloordiv", "remainder", "rmod", "fmod", "pow", "rpow", "float_power", "eq",
    "ne", "lt", "le", "gt", "ge", "greater", "less", "greater_equal", "less_equal",
    "not_equal", "maximum", "minimum", "fmax", "fmin", "where", "masked_fill",
    "atan2", "arctan2", "hypot", "copysign", "logaddexp", "logaddexp2", "xlogy",
    "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
    "bitwise_xor", "and", "or", "xor", "lerp", "addcmul", "addcdiv", "clamp",
    "clip", "heaviside", "nextafter", "ldexp", "isclose", "lshift", "rshift",
    "subtract", "multiply", "divide",
}

# Operations that keep the shape but combine entries along `dim`.
_DIM_MIXERS = {
    "softmax": ("dim", 1, "softmax"), "log_softmax": ("dim", 1, "softmax"),
    "softmin": ("dim", 1, "softmax"), "_softmax": ("dim", 1, None),
    "_log_softmax": ("dim", 1, None), "cumsum": ("dim", 1, None),
    "cumprod": ("dim", 1, None), "cummax": ("dim", 1, None),
    "cummin": ("dim", 1, None), "logcumsumexp": ("dim", 1, None),
    "sort": ("dim", 1, -1), "argsort": ("dim", 1, -1), "msort": (None, None, 0),
    "flip": ("dims", 1, None), "fliplr": (None, None, 1), "flipud": (None, None, 0),
    "roll": ("dims", 2, "all"), "normalize": ("dim", 2, 1),
}

# Operations that pick entries of `dim` by position or index.
_SELECTORS = {
    "select": ("dim", 1), "narrow": ("dim", 1), "index_select": ("dim", 1),
    "gather": ("dim", 1), "scatter": ("dim", 1), "scatter_add": ("dim", 1),
    "scatter_reduce": ("dim", 1), "index_add": ("dim", 1), "index_copy": ("dim", 1),
    "index_fill": ("dim", 1), "take_along_dim": ("dim", 2), "split": ("dim", 2),
    "chunk": ("dim", 2), "tensor_split": ("dim", 2), "unbind": ("dim", 1),
    "split_with_sizes": ("dim", 2), "take": (None, None),
}

# Operations that need the batch at dimension 0 (N of NCHW).
_BATCH_FIRST = {
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "max_pool1d", "max_pool2d", "max_pool3d",
    "max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices",
    "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_max_pool1d",
    "adaptive_max_pool2d", "adaptive_max_pool3d", "adaptive_avg_pool1d",
    "adaptive_avg_pool2d", "adaptive_avg_pool3d", "lp_pool1d", "lp_pool2d",
    "interpolate", "upsample", "upsample_nearest", "upsample_bilinear",
    "pixel_shuffle", "pixel_unshuffle", "group_norm", "instance_norm",
    "local_response_norm", "dropout2d", "dropout3d", "feature_alpha_dropout",
    "grid_sample", "affine_grid", "fold", "channel_shuffle",
    "fractional_max_pool2d", "fractional_max_pool3d",
}

_DATA_DEPENDENT = {
    "nonzero", "masked_select", "argwhere", "unique", "unique_consecutive",
    "repeat_interleave", "masked_scatter",
}


def _loss_table():
    t = {}

    def add(name, per_sample, kind="elementwise", class_weight=False):
        fn = getattr(F, name, None)
        if fn is not None:
            t[fn] = (name, per_sample, kind, class_weight)

    add("cross_entropy", ("target",), "classes", True)
    add("nll_loss", ("target",), "classes", True)
    for n in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "soft_margin_loss",
              "hinge_embedding_loss", "multilabel_margin_loss", "poisson_nll_loss", "kl_div"):
        add(n, ("target",))
    add("binary_cross_entropy", ("target", "weight"))
    add("binary_cross_entropy_with_logits", ("target", "weight"))  # weight: per element
    add("gaussian_nll_loss", ("target", "var"))
    add("margin_ranking_loss", ("input2", "target"))
    add("cosine_embedding_loss", ("input2", "target"))
    add("multilabel_soft_margin_loss", ("target",), "elementwise", True)
    add("multi_margin_loss", ("target",), "elementwise", True)
    add("triplet_margin_loss", ("positive", "negative"))
    add("triplet_margin_with_distance_loss", ("positive", "negative"))
    add("ctc_loss", ())
    return t


_LOSSES = _loss_table()

_SIGNATURES = {}


def _bind(fn, args, kwargs):
    sig = _SIGNATURES.get(fn)
    if sig is None:
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = False
        _SIGNATURES[fn] = sig
    if not sig:
        return None
    try:
        b = sig.bind(*args, **kwargs)
    except TypeError:
        return None
    b.apply_defaults()
    return b.arguments


def _reduction(arguments):
    """The reduction string of a bound F.*_loss call (legacy arguments too)."""
    size_average = arguments.get("size_average")
    reduce = arguments.get("reduce")
    if size_average is not None or reduce is not None:
        from torch.nn import _reduction as _R

        return _R.legacy_get_string(size_average, reduce, emit_warning=False)
    return arguments.get("reduction", "mean")


# ---------------------------------------------------------------------------
# Recording


def _scan(obj, nodes, plains, bints, eager):
    """Template of obj: LazyTensor -> its Node (or its value, when already
    computed); collects nodes, plain tensors, BatchInts, computed nodes."""
    t = type(obj)
    if t is LazyTensor:
        n = obj._node
        if n.state == "eager":
            eager.append(n)
            return n.value
        nodes.append(n)
        return n
    if t is tuple or t is list:
        out = [_scan(o, nodes, plains, bints, eager) for o in obj]
        return out if t is list else tuple(out)
    if t is dict:
        return {k: _scan(v, nodes, plains, bints, eager) for k, v in obj.items()}
    if t is BatchInt:
        bints.append(obj)
        return obj
    if isinstance(obj, torch.Tensor):
        plains.append(obj)
        return obj
    if isinstance(obj, torch.Size):
        if any(type(o) is BatchInt for o in obj):
            return tuple(_scan(o, nodes, plains, bints, eager) for o in obj)
        return obj
    return obj


def _replace(obj, mapping):
    """obj with the plain tensors in `mapping` (by id) replaced."""
    t = type(obj)
    if t is tuple or t is list:
        out = [_replace(o, mapping) for o in obj]
        return out if t is list else tuple(out)
    if t is dict:
        return {k: _replace(v, mapping) for k, v in obj.items()}
    if isinstance(obj, torch.Tensor):
        return mapping.get(id(obj), obj)
    return obj


class ProbeCtx:
    """Where subst() finds values when running on the i-th probe."""

    __slots__ = ("i", "start", "size")

    def __init__(self, i, size):
        self.i, self.start, self.size = i, 0, size

    def value(self, node):
        return node.probe_at(self.i)


def subst(obj, ctx):
    """The template `obj` made real for a probe or a chunk."""
    t = type(obj)
    if t is Node:
        return ctx.value(obj)
    if t is tuple:
        return tuple([subst(o, ctx) for o in obj])
    if t is list:
        return [subst(o, ctx) for o in obj]
    if t is dict:
        return {k: subst(v, ctx) for k, v in obj.items()}
    if t is BatchInt:
        return obj.k * ctx.size
    if t is Sliced:
        return obj.tensor.narrow(obj.dim, obj.k * ctx.start, obj.k * ctx.size)
    if t is Arange:
        return torch.arange(ctx.start, ctx.start + ctx.size, device=obj.device,
                            dtype=obj.dtype) - ctx.start
    return obj


try:  # torch >= 2.4: per-device autocast queries (the old ones are deprecated)
    torch.is_autocast_enabled("cpu")

    def _autocast_state():
        return tuple((d, torch.get_autocast_dtype(d)) for d in ("cuda", "cpu")
                     if torch.is_autocast_enabled(d))
except TypeError:  # torch 1.13 .. 2.3

    def _autocast_state():
        out = []
        if torch.is_autocast_enabled():
            out.append(("cuda", torch.get_autocast_gpu_dtype()))
        if torch.is_autocast_cpu_enabled():
            out.append(("cpu", torch.get_autocast_cpu_dtype()))
        return tuple(out)


def _grad_autocast():
    """(grad enabled, autocast state or None) now."""
    return torch.is_grad_enabled(), (_autocast_state() or None)


def _mix_error(what, node_desc, fix=None):
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


def _norm_dim(d, ndim):
    if d is None:
        return None
    d = int(d)
    return d + ndim if d < 0 else d


def _arg(args, kwargs, name, pos, default=None):
    if name is not None and name in kwargs:
        return kwargs[name]
    if pos is not None and len(args) > pos:
        return args[pos]
    return default


def _bdim_set(node):
    return {d for d, _ in node.bdims} | set(node.ragged)


def _check_mixing(fn, op, args, kwargs, first, batched, where):
    """Raise for name-known operations that mix samples. `first` is the
    first lazy tensor argument's node (None if the first arg is not lazy)."""
    label = f"{display_name(fn)} at {where}"
    if first is None or first.state != "batched":
        if op == "batch_norm" and batched:
            pass
        else:
            return
    ndim = len(first.shape) if first is not None and first.shape is not None else 0
    bd = _bdim_set(first) if first is not None else set()
    if op in _DIM_MIXERS:
        name, pos, default = _DIM_MIXERS[op]
        dims = _arg(args, kwargs, name, pos, None) if name else None
        if dims is None:
            if default == "softmax":
                dims = 0 if ndim in (0, 1, 3) else 1
            elif default == "all":
                dims = list(range(ndim))
            else:
                dims = default
        if dims is None:
            return
        dims = dims if isinstance(dims, (list, tuple)) else [dims]
        if any(_norm_dim(d, ndim) in bd for d in dims):
            raise _mix_error(f"{display_name(fn)} along the batch dimension", label)
        return
    if op in _SELECTORS:
        name, pos = _SELECTORS[op]
        if name is None:
            raise _mix_error(f"{display_name(fn)} (indexes the flattened tensor)", label)
        d = _arg(args, kwargs, name, pos, 0 if op in ("split", "chunk", "tensor_split",
                                                    "unbind", "split_with_sizes") else None)
        if d is None:  # take_along_dim without dim flattens
            raise _mix_error(f"{display_name(fn)} over the flattened tensor", label)
        if _norm_dim(d, ndim) in bd:
            raise _mix_error(
                f"{display_name(fn)} picks entries of the batch dimension by position",
                label,
                "Select samples before memfit.lazy(), or pass allow_mixing=True to run "
                "it whole.",
            )
        return
    if op in _BATCH_FIRST:
        if bd != {0} or first.ragged:
            raise _mix_error(
                f"{display_name(fn)} reads dimension 0 as the batch, but the batch is in "
                f"dimension(s) {sorted(bd)}", label)
        return
    if op == "layer_norm":
        ns = _arg(args, kwargs, "normalized_shape", 1, ())
        ns = [ns] if isinstance(ns, int) else list(ns)
        if any(d in bd for d in range(ndim - len(ns), ndim)):
            raise _mix_error("F.layer_norm normalizes over the batch dimension", label)
        return
    if op == "batch_norm":
        # F.batch_norm(input, running_mean, running_var, weight, bias, training, ...)
        # torch.batch_norm(input, weight, bias, running_mean, running_var, training, ...)
        training = _arg(args, kwargs, "training", 5, False)
        if training:
            raise _mix_error(
                "batch_norm in training mode (normalizes with statistics of the whole "
                "batch)", label,
                "Put the BatchNorm layers in eval mode, use GroupNorm/LayerNorm, or pass "
                "allow_mixing=True to run the step whole.")
        if bd != {0}:
            raise _mix_error("batch_norm with the batch outside dimension 0", label)
        return
    if op == "multi_head_attention_forward" or op == "scaled_dot_product_attention":
        if op == "multi_head_attention_forward":
            expect = {1} if ndim == 3 else set()
        else:
            expect = None
        if expect is not None and bd != expect:
            raise _mix_error(
                f"{display_name(fn)} with the batch in dimension(s) {sorted(bd)} of a "
                f"(L, N, E) query: attention would run across samples", label)
        if expect is None and bd & {ndim - 1, ndim - 2}:
            raise _mix_error("attention over the batch dimension", label)


def _getitem_analysis(first, index, where):
    """Check x[index] for a batched x; returns the index with arange
    indices of the batch dimension marked, or raises."""
    idx = index if type(index) is tuple else (index,)
    ndim = len(first.shape)
    bd = _bdim_set(first)

    def width(e):
        if e is None or e is Ellipsis:
            return 0
        if type(e) is Node:
            return len(e.shape) if e.dtype == torch.bool else 1
        if isinstance(e, torch.Tensor) and e.dtype == torch.bool:
            return e.dim()
        return 1

    used = sum(width(e) for e in idx)
    out = []
    d = 0
    label = f"indexing x[...] at {where}"
    for e in idx:
        if e is None:
            out.append(e)
            continue
        if e is Ellipsis:
            d += ndim - used
            out.append(e)
            continue
        w = width(e)
        covered = set(range(d, d + w))
        if covered & bd:
            ok = False
            if isinstance(e, slice) and e == slice(None):
                ok = True
            elif type(e) is Node and e.dtype == torch.bool and e.state == "batched":
                # a per-sample mask aligned with the batch dimension(s)
                ok = {dd + d for dd in _bdim_set(e)} == (covered & bd)
            elif isinstance(e, (torch.Tensor, range, list)) and not (
                isinstance(e, torch.Tensor) and e.dtype == torch.bool
            ):
                t = e if isinstance(e, torch.Tensor) else torch.as_tensor(list(e))
                n = first.shape[d]
                if (t.dim() == 1 and t.numel() == n and len(bd & covered) == 1
                        and dict(first.bdims).get(d) == 1
                        and torch.equal(t.cpu(), torch.arange(n, dtype=t.dtype))):
                    e = Arange(t.device if isinstance(e, torch.Tensor) else first.device,
                               t.dtype)
                    ok = True
            if not ok:
                raise _mix_error(
                    "indexing the batch dimension (x[i], x[a:b], x[idx]) picks samples by "
                    "position", label,
                    "Keep ':' for the batch dimension (a lazy boolean mask works too), "
                    "select samples before memfit.lazy(), or pass allow_mixing=True.")
        out.append(e)
        d += w
    return tuple(out) if type(index) is tuple else out[0]


def _plain_rules(fn, op, targs, tkw, args, kwargs, plains, first, B, where, module):
    """Decide, for each plain tensor argument, whether it holds samples
    (sliced with the chunk) or is the same for every sample. Returns a
    mapping id(tensor) -> Sliced, or raises when it cannot tell."""
    mapping = {}
    if not plains or first is None or first.state != "batched" or B is None or B < 2:
        return mapping
    factors = {k for _, k in first.bdims} or {1}
    sizes = {k * B for k in factors}
    loss = _LOSSES.get(fn)
    if loss is not None:
        # Targets (and second inputs) of torch's losses hold one entry per
        # sample along dimension 0, like the input; a per-element `weight`
        # broadcasts like an elementwise operand; class weights are constants.
        arguments = _bind(fn, args, kwargs) or {}
        fb = first.single_bdim()
        n = len(first.shape)
        skip = set()
        for pname in loss[1]:
            t = arguments.get(pname)
            if not isinstance(t, torch.Tensor) or t.requires_grad or fb is None:
                continue
            j = fb[0] - (n - t.dim()) if pname == "weight" else fb[0]
            if fb[0] == 0 or pname == "weight":
                if 0 <= j < t.dim() and t.shape[j] == fb[1] * B:
                    mapping[id(t)] = Sliced(t, j, fb[1])
                elif pname == "weight":
                    skip.add(id(t))  # broadcast over the samples
        if loss[3]:
            skip.add(id(arguments.get("weight")))
        skip.add(id(arguments.get("pos_weight")))
        _refuse_sample_sized([t for t in plains if id(t) not in skip and id(t) not in mapping],
                             sizes, fn, where, B, module)
        return mapping
    if op in _POINTWISE:
        fb = first.single_bdim() or (first.bdims[0] if first.bdims else None)
        n = len(first.shape)
        for t in plains:
            if t.requires_grad or fb is None:
                continue
            j = fb[0] - (n - t.dim())
            if 0 <= j < t.dim() and t.shape[j] == fb[1] * B and t.shape[j] > 1:
                if first.interleaved and fb[1] > 1:
                    raise LazyError(
                        f"memfit.lazy: a plain tensor of shape {tuple(t.shape)} is combined "
                        f"in {display_name(fn)} at {where} with a lazy tensor whose batch "
                        f"dimension is interleaved with another; make it lazy too")
                mapping[id(t)] = Sliced(t, j, fb[1])
        return mapping
    if op == "getitem":
        return mapping  # indices are handled by _getitem_analysis
    _refuse_sample_sized(plains, sizes, fn, where, B, module)
    return mapping


def _refuse_sample_sized(plains, sizes, fn, where, B, module):
    for t in plains:
        if t.requires_grad or isinstance(t, torch.nn.Parameter):
            continue
        hits = [d for d, s in enumerate(t.shape) if s in sizes]
        if hits:
            raise LazyError(
                f"memfit.lazy: a plain tensor of shape {tuple(t.shape)} is passed to "
                f"{display_name(fn)} at {where} together with lazy tensors of {B} samples, "
                f"and its dimension {hits[0]} has {t.shape[hits[0]]} entries. memfit cannot "
                f"tell whether it holds one entry per sample. If it does, make it lazy too: "
                f"memfit.lazy(t, batch={hits[0]}); if it is the same for every sample, pass "
                f"memfit.lazy(t, batch=None)."
            )


def _info_from(t1, t2, sizes, B, op, name, data_dep, derived):
    """What the two probe results t1, t2 (for sizes[0] and sizes[1] samples)
    say about a tensor result: batch dimensions, full shape, layout, and
    `why` it mixes samples (None if it does not)."""
    info = _Info()
    info.dtype, info.device, info.requires_grad = t1.dtype, t1.device, t1.requires_grad
    info.why = None
    p1, p2 = sizes
    if t1.dim() != t2.dim():
        raise LazyError(
            f"memfit.lazy: the result of {name} has {t1.dim()} dimensions for {p1} samples "
            f"and {t2.dim()} for {p2}: its rank depends on the batch size (often a "
            f"squeeze() without a dim). Give the dimension explicitly."
        )
    bdims, ragged, shape, irregular = [], [], [], []
    for d, (a, b) in enumerate(zip(t1.shape, t2.shape)):
        if a == b:
            shape.append(a)
            continue
        if data_dep:
            ragged.append(d)
            shape.append(None)
            continue
        diff = b - a
        if diff > 0 and diff % (p2 - p1) == 0 and a == (diff // (p2 - p1)) * p1:
            k = diff // (p2 - p1)
            bdims.append((d, k))
            shape.append(k * B)
        else:
            irregular.append(d)
            k = (b - a) / (p2 - p1)
            full = a + k * (B - p1)
            shape.append(int(full) if float(full).is_integer() and full >= 0 else None)
    info.bdims, info.ragged, info.shape = tuple(bdims), tuple(ragged), tuple(shape)
    # Layout: a merged or ragged batch dimension is usable as a concatenation
    # axis only if the first samples' entries come first (x.view(B*T, C) yes,
    # x.transpose(0, 1).reshape(T*B, C) no). Tested on the probes: the p1
    # probe's result must be the start of the p2 probe's.
    info.interleaved = False
    for d, k in list(bdims) + [(d, None) for d in ragged]:
        if k == 1:
            continue
        n1 = t1.shape[d]
        try:
            head = t2.narrow(d, 0, n1)
            same = head.shape == t1.shape and _close(head, t1)
        except Exception:
            same = False
        if not same:
            info.interleaved = True
    if bdims or ragged:
        info.state = "batched"
    elif derived:
        info.state = "reduced"
    else:
        info.state = "constant"
    if irregular:
        info.why = (f"{name} changes the batch dimension's size in a way that does not "
                    f"scale with the number of samples")
    elif len(bdims) + len(ragged) > 1:
        info.why = (f"{name} puts the batch in more than one dimension ({len(bdims) + len(ragged)}"
                    f" dimensions grow with the batch: a pairwise or outer product of samples)")
    return info


def _close(a, b):
    if a.dtype.is_floating_point or a.dtype.is_complex:
        a = a.detach()
        b = b.detach()
        tol = 1e-2 if a.element_size() < 4 else 1e-4
        return bool(torch.allclose(a.float(), b.float(), rtol=tol, atol=tol))
    return bool(torch.equal(a.detach(), b.detach()))


def _has_tensor(o):
    if isinstance(o, torch.Tensor):
        return True
    if isinstance(o, (tuple, list)):
        return any(_has_tensor(x) for x in o)
    if isinstance(o, dict):
        return any(_has_tensor(x) for x in o.values())
    return False


def _rebuild(o1, o2, sizes, B, fn, path, makers):
    """The user-visible result: the structure of o1 with lazy tensors."""
    if isinstance(o1, torch.Tensor):
        return makers(path)
    if isinstance(o1, (tuple, list)):
        items = [_rebuild(a, b, sizes, B, fn, path + (i,), makers)
                 for i, (a, b) in enumerate(zip(o1, o2))]
        return _make_seq(type(o1), items)
    if isinstance(o1, dict):
        items = {k: _rebuild(o1[k], o2[k], sizes, B, fn, path + (k,), makers) for k in o1}
        try:
            return type(o1)(items)
        except Exception:
            return items
    return _scalar_result(o1, o2, sizes, B, fn)


def _make_seq(typ, items):
    """A sequence of type typ holding items: tuple, list, namedtuple (or
    PackedSequence), torch.return_types; a tuple if typ cannot be built."""
    try:
        if typ is tuple or typ is list:
            return typ(items)
        if hasattr(typ, "_fields"):
            return typ(*items)
        return typ(items)
    except Exception:
        return tuple(items)


def _scalar_result(a, b, sizes, B, fn):
    if a == b or len(sizes) < 2:
        return a
    if type(a) is int and type(b) is int:
        p1, p2 = sizes
        k, r = divmod(b - a, p2 - p1)
        if r == 0:
            return a + k * (B - p1)
    raise LazyError(
        f"memfit.lazy: {display_name(fn)} returns {a!r} for {sizes[0]} samples and {b!r} "
        f"for {sizes[1]}: a Python value that depends on the batch; compute it with "
        f"memfit.eager() first"
    )


def record(fn, args, kwargs, name=None, module=None):
    """Record fn(*args, **kwargs) where some args are lazy tensors; returns
    the lazy result (or, for operations returning plain Python values,
    the value)."""
    op = op_name(fn)
    if module is None:
        if (op.endswith("_") and not op.startswith("__") and op not in ("__", "_")) \
                or op in _INPLACE_DUNDERS:
            raise _inplace_error(f"{display_name(fn)}()",
                                 args[0] if args and isinstance(args[0], LazyTensor) else None)
        if kwargs.get("out") is not None:
            raise _inplace_error(f"{display_name(fn)}(..., out=...)")
        if kwargs.get("inplace") or (op in _INPLACE_ARG and _inplace_positional(fn, args, kwargs)):
            raise _inplace_error(f"{display_name(fn)}(..., inplace=True)",
                                 args[0] if args and isinstance(args[0], LazyTensor) else None)
    where = _where()
    name = name or display_name(fn)
    nodes, plains, bints, eager = [], [], [], []
    targs = _scan(args, nodes, plains, bints, eager)
    tkw = _scan(kwargs, nodes, plains, bints, eager)

    Bs = {n.B for n in nodes + eager if n.B is not None} | {b.batch for b in bints}
    if len(Bs) > 1:
        raise LazyError(
            f"memfit.lazy: {name} at {where} combines lazy tensors with different batch "
            f"sizes {sorted(Bs)}; lazy tensors used together must hold the same samples"
        )
    B = Bs.pop() if Bs else None
    allow = any(n.allow for n in nodes)
    parents = tuple(dict.fromkeys(nodes))
    mixes = next((n.mixes for n in parents if n.mixes), None)
    first = None
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, LazyTensor):
            first = a._node
            break
    first_arg_lazy = bool(args) and isinstance(args[0], LazyTensor)
    batched_parents = [n for n in parents if n.state == "batched"]

    if B is not None and B >= 2:
        # A value reduced over the batch must not meet per-sample values again.
        reduced = [n for n in parents if n.state == "reduced"]
        if reduced and (batched_parents or bints):
            r = reduced[0]
            msg = _mix_error(
                f"{r.name} at {r.where} reduces over the batch dimension and its result "
                f"is combined with per-sample values in {name}", f"at {where}")
            if not allow:
                raise msg
            mixes = mixes or str(msg)
        if module is None:
            try:
                _check_mixing(fn, op, args, kwargs,
                              first if first_arg_lazy or op == "batch_norm" else first,
                              batched_parents, where)
            except LazyError as e:
                if not allow:
                    raise
                mixes = mixes or str(e)
            if op == "getitem" and first_arg_lazy and first.state == "batched":
                try:
                    targs = (targs[0], _getitem_analysis(first, targs[1], where)) + tuple(targs[2:])
                except LazyError as e:
                    if not allow:
                        raise
                    mixes = mixes or str(e)
        if op == "squeeze" and first_arg_lazy and first.state == "batched" and \
                len(args) == 1 and "dim" not in kwargs:
            # squeeze() would drop the batch dimension of a one-sample chunk:
            # squeeze exactly the dimensions that are 1 for the full batch.
            fn = _squeeze_dims
            bd = _bdim_set(first)
            targs = (targs[0], tuple(d for d, n in enumerate(first.shape)
                                     if n == 1 and d not in bd))
        constants = {id(n.value) for n in eager}
        plains = [t for t in plains if id(t) not in constants]
        mapping = _plain_rules(fn, op, targs, tkw, args, kwargs, plains,
                               first if first is not None and first.state == "batched"
                               else (batched_parents[0] if batched_parents else None),
                               B, where, module)
        if mapping:
            targs = _replace(targs, mapping)
            tkw = _replace(tkw, mapping)

    sizes = probe_sizes(B)
    grad, autocast = _grad_autocast()
    if not sizes:
        # Nothing to split (no batch, or one sample): run now, keep the value.
        real_args = subst(targs, _EagerCtx())
        real_kw = subst(tkw, _EagerCtx())
        out = fn(*real_args, **real_kw)
        return _wrap_eager(out, B, allow, name, where)

    data_dep = op in _DATA_DEPENDENT or (op == "getitem" and _has_bool_lazy_index(targs))
    derived = bool(batched_parents or bints or any(p.state == "reduced" for p in parents))
    # See Note [Probe cache].
    key = None if data_dep else _probe_key(fn, module, targs, tkw, B, grad, autocast)
    desc = _probe_cache_get(key)
    probes = None
    if desc is None:
        for p in parents:
            ensure_probe(p)
        outs = []
        for i, p in enumerate(sizes):
            ctx = ProbeCtx(i, p)
            a = subst(targs, ctx)
            kw = subst(tkw, ctx)
            try:
                outs.append(fn(*a, **kw))
            except OutOfMemoryError:
                raise
            except LazyError:
                raise
            except Exception as e:
                hint = ""
                if any(type(v) is int and v in (B, 2 * B) for v in _flat(args)):
                    hint = (" A shape argument equal to the batch size must come from "
                            "x.size(d) or x.shape[d], so that it follows the chunk.")
                raise LazyError(
                    f"memfit.lazy: {name} at {where} failed when tried on the first {p} "
                    f"samples (memfit runs each recorded operation on a few samples to learn "
                    f"its shapes): {type(e).__name__}: {e}.{hint}"
                ) from e
        o1, o2 = outs
        if not _has_tensor(o1):
            # A Python value. Metadata (is_floating_point, is_contiguous, a
            # size) is the probes'; a value of the data (torch.equal,
            # allclose) is computed on the full batch now.
            if op not in _DATA_VALUED:
                try:
                    return _rebuild(o1, o2, sizes, B, fn, (), None)
                except LazyError:
                    pass
            from .lazy_run import read

            full_args = _materialize_args(targs, read)
            full_kw = _materialize_args(tkw, read)
            return fn(*full_args, **full_kw)
        desc = _describe(o1, o2, sizes, B, op, name, data_dep, derived, fn)
        if key is not None:
            _probe_cache_put(key, desc)
        probes = (o1, o2)

    node = Node("op")
    node.fn, node.args, node.kwargs = fn, targs, tkw
    node.parents = parents
    node.name, node.op, node.where = name, op, where
    node.B, node.allow = B, allow
    node.grad, node.autocast = grad, autocast
    node.module = module
    node.mixes = mixes
    node.cached = probes is None

    def finish(n, info):
        _apply_info(n, info)
        if info.why:
            if not allow:
                raise _mix_error(info.why, f"at {where}")
            n.mixes = n.mixes or info.why
        if n.state == "reduced" and batched_parents:
            _root_kind(n, fn, op, args, kwargs, targs, tkw, first)

    if type(desc) is _Info:
        finish(node, desc)
        node.probe = probes or ()
        return LazyTensor(node)

    node.state = "struct"
    node.probe = probes or ()

    def make(path, info):
        item = Node("item")
        item.parent = node
        item.parents = (node,)
        item.path = path
        item.name = f"{name}{''.join(f'[{p!r}]' for p in path)}"
        item.op = "item"
        item.where, item.B, item.allow, item.mixes = where, B, allow, mixes
        item.grad, item.autocast = grad, autocast
        item.cached = node.cached
        finish(item, info)
        if probes is not None:
            item.probe = tuple(_pluck(o, path) for o in probes)
        return LazyTensor(item)

    return _rebuild_skel(desc, make, ())


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
# what its first chunk returns (lazy_run), and the stale entry is dropped.

_PROBE_CACHE_MAX = 4096
_probe_cache = {}


class _Uncacheable(Exception):
    pass


def _probe_cache_get(key):
    if key is None:
        return None
    return _probe_cache.get(key)


def _probe_cache_put(key, desc):
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


def _probe_key(fn, module, targs, tkw, B, grad, autocast):
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


def ensure_probe(node):
    """Compute the probe values of a node filled from the probe cache (and
    of its ancestors that lack them)."""
    if node.probe or node.state == "eager":
        return
    todo, seen, stack = [], set(), [node]
    while stack:
        n = stack.pop()
        if n in seen or n.probe or n.state == "eager":
            continue
        seen.add(n)
        todo.append(n)
        stack.extend(n.parents)
    todo.sort(key=lambda n: n.id)
    for n in todo:
        if n.kind == "item":
            n.probe = tuple(_pluck(v, n.path) for v in n.parent.probe)
            continue
        outs = []
        with torch.set_grad_enabled(n.grad):
            for i, p in enumerate(probe_sizes(n.B)):
                ctx = ProbeCtx(i, p)
                if n.autocast:
                    from .lazy_run import _autocast_ctx

                    with _autocast_ctx(n.autocast):
                        outs.append(n.fn(*subst(n.args, ctx), **subst(n.kwargs, ctx)))
                else:
                    outs.append(n.fn(*subst(n.args, ctx), **subst(n.kwargs, ctx)))
        n.probe = tuple(outs)


def _flat(obj):
    if isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _flat(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _flat(o)
    else:
        yield obj


class _Info:
    """What the probes taught about one tensor result."""

    __slots__ = ("state", "bdims", "ragged", "shape", "interleaved", "dtype", "device",
                 "requires_grad", "why")


class _Seq:
    __slots__ = ("typ", "items")

    def __init__(self, typ, items):
        self.typ, self.items = typ, items


class _Map:
    __slots__ = ("typ", "items")

    def __init__(self, typ, items):
        self.typ, self.items = typ, items


def _describe(o1, o2, sizes, B, op, name, data_dep, derived, fn):
    """The skeleton of a probe result: _Info for tensors, plain values
    elsewhere, containers kept."""
    if isinstance(o1, torch.Tensor):
        return _info_from(o1, o2, sizes, B, op, name, data_dep, derived)
    if isinstance(o1, (tuple, list)):
        return _Seq(type(o1), [_describe(a, b, sizes, B, op, name, data_dep, derived, fn)
                               for a, b in zip(o1, o2)])
    if isinstance(o1, dict):
        return _Map(type(o1), {k: _describe(o1[k], o2[k], sizes, B, op, name, data_dep,
                                            derived, fn) for k in o1})
    return _scalar_result(o1, o2, sizes, B, fn)


def _rebuild_skel(skel, make, path):
    if type(skel) is _Info:
        return make(path, skel)
    if type(skel) is _Seq:
        items = [_rebuild_skel(x, make, path + (i,)) for i, x in enumerate(skel.items)]
        return _make_seq(skel.typ, items)
    if type(skel) is _Map:
        items = {k: _rebuild_skel(v, make, path + (k,)) for k, v in skel.items.items()}
        try:
            return skel.typ(items)
        except Exception:
            return items
    return skel


def _apply_info(n, info):
    n.state = info.state
    n.bdims, n.ragged, n.shape = info.bdims, info.ragged, info.shape
    n.interleaved = info.interleaved
    n.dtype, n.device, n.requires_grad = info.dtype, info.device, info.requires_grad


_DATA_VALUED = {
    "equal", "allclose", "is_nonzero", "item", "tolist", "bool", "int", "float",
    "index", "complex", "contains", "numpy", "array", "format", "repr", "str",
    "any", "all",
}


def _squeeze_dims(t, dims):
    for d in sorted(dims, reverse=True):
        t = t.squeeze(d)
    return t


_squeeze_dims._memfit_op = "squeeze"
_squeeze_dims._memfit_display = "Tensor.squeeze"

_INPLACE_ARG = {
    "relu", "relu6", "elu", "selu", "celu", "leaky_relu", "rrelu", "hardtanh",
    "threshold", "dropout", "alpha_dropout", "feature_alpha_dropout", "dropout1d",
    "dropout2d", "dropout3d", "hardsigmoid", "hardswish", "silu", "mish",
}


def _inplace_positional(fn, args, kwargs):
    arguments = _bind(fn, args, kwargs)
    return bool(arguments and arguments.get("inplace"))


def _has_bool_lazy_index(targs):
    if len(targs) < 2:
        return False
    idx = targs[1] if type(targs[1]) is tuple else (targs[1],)
    return any(type(e) is Node and e.dtype == torch.bool for e in idx)


def _pluck(value, path):
    for p in path:
        value = value[p]
    return value


class _EagerCtx:
    i = 0
    start = 0
    size = 1

    def value(self, node):
        return node.value if node.state == "eager" else node.probe_at(0)


def _wrap_eager(out, B, allow, name, where):
    """Results computed at once (no batch to split): lazy tensors that hold
    their value."""

    def wrap(o):
        if isinstance(o, torch.Tensor):
            n = Node("leaf")
            n.value = o
            n.state = "eager"
            n.B, n.allow, n.name, n.where = B, allow, name, where
            n.shape = tuple(o.shape)
            n.dtype, n.device, n.requires_grad = o.dtype, o.device, o.requires_grad
            return LazyTensor(n)
        if isinstance(o, (tuple, list)):
            return _make_seq(type(o), [wrap(x) for x in o])
        if isinstance(o, dict):
            return type(o)({k: wrap(v) for k, v in o.items()})
        return o

    return wrap(out)


def _materialize_args(obj, read):
    t = type(obj)
    if t is Node:
        return read(obj)
    if t is tuple or t is list:
        out = [_materialize_args(o, read) for o in obj]
        return out if t is list else tuple(out)
    if t is dict:
        return {k: _materialize_args(v, read) for k, v in obj.items()}
    if t is Sliced:
        return obj.tensor
    if t is Arange:
        raise LazyError("memfit.lazy: internal: arange index in a Python-valued op")
    return obj


def _root_kind(n, fn, op, args, kwargs, targs, tkw, first):
    """For a node that reduces batched values: how chunk results add up.
    rkind "sum" (chunks add), "mean" (chunk i weighs c_i/B), "classes"
    (cross_entropy/nll_loss mean: weighs its counted targets), else None."""
    if any(p.ragged for p in n.parents if p.state == "batched"):
        if op in ("sum", "nansum"):
            n.rkind = "sum"
        return
    if op in ("sum", "nansum"):
        n.rkind = "sum"
        return
    if op == "mean":
        n.rkind = "mean"
        return
    loss = _LOSSES.get(fn)
    if loss is None:
        return
    arguments = _bind(fn, args, kwargs)
    if arguments is None:
        return
    red = _reduction(arguments)
    lname, _, kind, _ = loss
    if red == "sum":
        n.rkind = "sum"
    elif red == "batchmean":
        n.rkind = "mean"
    elif red == "mean":
        n.rkind = "mean"
        if kind == "classes":
            target = arguments.get("target")
            tdtype = target.dtype if isinstance(target, (torch.Tensor, LazyTensor)) else None
            if tdtype is not None and not tdtype.is_floating_point:
                tb = _bind(fn, targs, tkw) or {}
                n.rkind = "classes"
                n.rinfo = {
                    "target": tb.get("target"),
                    "weight": arguments.get("weight"),
                    "ignore_index": arguments.get("ignore_index", -100),
                }
        if lname == "ctc_loss":
            n.rkind = "mean"


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


# ---------------------------------------------------------------------------
# Module calls

_orig_module_call = None
_BN = torch.nn.modules.batchnorm._BatchNorm


def _any_lazy(args, kwargs):
    for a in args:
        t = type(a)
        if t is LazyTensor:
            return True
        if t is tuple or t is list:
            for b in a:
                if type(b) is LazyTensor:
                    return True
    if kwargs:
        for a in kwargs.values():
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
    if getattr(orig, "_memfit_wrapper", False):
        _orig_module_call = orig._memfit_orig
        return
    _orig_module_call = orig

    def __call__(self, *args, **kwargs):
        if _any_lazy(args, kwargs):
            return record_module_call(self, args, kwargs)
        return orig(self, *args, **kwargs)

    __call__._memfit_wrapper = True
    __call__._memfit_orig = orig
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
            first = a._node
            break
    allow = any(isinstance(a, LazyTensor) and a._node.allow
                for a in list(args) + list(kwargs.values()))
    where = _where()
    label = f"{type(module).__name__} at {where}"
    mixes = None
    batched = first is not None and first.state == "batched" and first.B and first.B >= 2
    if batched:
        for path, m in module.named_modules():
            if isinstance(m, _BN) and m.training:
                e = _mix_error(
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
            x = args[0]._node
            ndim = len(x.shape)
            ok = _bdim_set(x) == {expect} if ndim >= 3 else False
            if not ok:
                e = _mix_error(
                    f"{type(module).__name__} reads dimension {expect} as the batch "
                    f"(batch_first={expect == 0}), but the lazy input's batch is in "
                    f"dimension(s) {sorted(_bdim_set(x))} of shape {x.shape}", label,
                    "Pass the input with the batch where the module expects it, or "
                    "set batch_first to match.")
                if not allow:
                    raise e
                mixes = mixes or str(e)
    out = record(module, args, kwargs, name=type(module).__name__, module=module)
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
        out._node.mixes = out._node.mixes or why
        if out._node.parent is not None:
            out._node.parent.mixes = out._node.parent.mixes or why
    elif isinstance(out, (tuple, list)):
        for o in out:
            _mark_mixes(o, why)
    elif isinstance(out, dict):
        for o in out.values():
            _mark_mixes(o, why)


def _has_reduced(out):
    if isinstance(out, LazyTensor):
        return out._node.state == "reduced"
    if isinstance(out, (tuple, list)):
        return any(_has_reduced(o) for o in out)
    if isinstance(out, dict):
        return any(_has_reduced(o) for o in out.values())
    return False


# ---------------------------------------------------------------------------
# Leaves


def make_leaf(tensor, batch, allow):
    """The lazy tensor for a tensor given to memfit.lazy()."""
    n = Node("leaf")
    n.value = tensor
    n.where = _where()
    n.allow = allow
    n.name = "memfit.lazy input"
    n.dtype, n.device, n.requires_grad = tensor.dtype, tensor.device, tensor.requires_grad
    n.shape = tuple(tensor.shape)
    if batch is None:
        n.state = "eager"
        return LazyTensor(n)
    B = tensor.shape[batch]
    n.B = B
    n.leaf_dim = batch
    sizes = probe_sizes(B)
    if not sizes:
        n.state = "eager"
        return LazyTensor(n)
    n.state = "batched"
    n.bdims = ((batch, 1),)
    n.probe = tuple(tensor.narrow(batch, 0, p) for p in sizes)
    return LazyTensor(n)
