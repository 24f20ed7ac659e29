"""record(): an operation on Nodes becomes a Node, checked for mixing, run
on the probes (or filled from the probe cache) and described; and the leaves
that memfit.lazy() makes. See the lazy_mode.graph package docstring.

The graph layer works on plain Nodes: the layer above (lazy_mode.tensor) passes
them in place of its lazy tensors, and says through RecordCallbacks what its
user holds for a result and how a full value is computed.
"""

import dataclasses
import typing

import torch

from .autocast import grad_autocast
from .errors import LazyError, OutOfMemoryError, mix_error, inplace_error
from .losses import root_kind
from .mixing import bdim_set, check_mixing, getitem_analysis
from .names import INPLACE_DUNDERS, user_line, display_name, op_name
from .node import Node, probe_sizes
from .op_tables import DATA_DEPENDENT, DATA_VALUED, INPLACE_ARG, PYTHON_VALUED, inplace_positional
from .placement import on_host, to_device
from .plain_tensors import plain_rules
from .probe import (ResultInfo, apply_info, describe_result, has_tensor, make_seq, rebuild,
                    rebuild_skel, ensure_probe, leaving_no_trace, without_history)
from .probe_cache import probe_cache_get, probe_cache_put, probe_key
from .template import (ProbeCtx, EagerCtx, flatten_args, materialize_args, pluck, replace_plains,
                       scan_args, subst)

__all__ = ["RecordCallbacks", "record", "make_leaf"]


@dataclasses.dataclass(frozen=True)
class RecordCallbacks:
    """What record() needs from the layers above it: `hold(node)`, what the
    user gets for a recorded Node (a LazyTensor); `read(node)`, its full
    value, for the operations that return a Python value of the data
    (torch.equal, allclose), computed on the full batch."""

    hold: typing.Callable
    read: typing.Callable


def _node_or_none(obj):
    return obj if type(obj) is Node else None


@dataclasses.dataclass
class _Call:
    """One operation as record()'s steps share it: the user's call (fn, op,
    args, kwargs, name, where, module), its arguments as templates (targs,
    tkw) and what they hold. check_batch_use() may replace fn, targs and
    tkw by what runs on a chunk."""

    fn: typing.Callable
    op: str
    args: tuple
    kwargs: dict
    name: str
    where: str
    module: object
    targs: object = None
    tkw: object = None
    nodes: list = dataclasses.field(default_factory=list)  # lazy arguments
    plains: list = dataclasses.field(default_factory=list)  # plain tensors beside them
    bints: list = dataclasses.field(default_factory=list)  # sizes that are the batch
    eager: list = dataclasses.field(default_factory=list)  # held values (no batch)
    B: typing.Optional[int] = None
    allow: bool = False
    parents: tuple = ()
    mixes: typing.Optional[str] = None
    first: typing.Optional[Node] = None  # the first lazy argument
    first_arg_lazy: bool = False
    batched_parents: list = dataclasses.field(default_factory=list)


def record(fn, args, kwargs, callbacks, name=None, module=None):
    """Record fn(*args, **kwargs) where some args are Nodes; returns the
    result with callbacks.hold() of each result Node in it (or, for
    operations returning plain Python values, the value)."""
    op = op_name(fn)
    if module is None:
        _refuse_in_place(fn, op, args, kwargs)
    call = _scan_call(fn, op, args, kwargs, name or display_name(fn), module)
    if op in PYTHON_VALUED and call.nodes:
        # A value of the data, over the full batch: the probes' few samples
        # would not match a plain full-batch tensor beside them.
        read = callbacks.read
        return fn(*materialize_args(call.targs, read), **materialize_args(call.tkw, read))
    if call.B is not None and call.B >= 2:
        _check_batch_use(call)

    sizes = probe_sizes(call.B)
    grad, autocast = grad_autocast()
    if not sizes:
        # Nothing to split (no batch, or one sample): run now, keep the value.
        out = call.fn(*subst(call.targs, EagerCtx()), **subst(call.tkw, EagerCtx()))
        return _wrap_eager(out, call.B, call.allow, call.name, call.where, callbacks.hold)

    data_dep = op in DATA_DEPENDENT or (op == "getitem" and _has_bool_lazy_index(call.targs))
    derived = bool(call.batched_parents or call.bints
                   or any(p.state == "reduced" for p in call.parents))
    # See Note [Probe cache].
    key = None if data_dep else probe_key(call.fn, module, call.targs, call.tkw, call.B, grad,
                                          autocast)
    desc = probe_cache_get(key)
    probes = None
    if desc is None:
        o1, o2 = _run_probes(call, sizes)
        if not has_tensor(o1):
            return _python_value(call, o1, o2, sizes, callbacks.read)
        desc = describe_result(o1, o2, sizes, call.B, op, call.name, data_dep, derived, call.fn)
        if key is not None:
            probe_cache_put(key, desc)
        probes = (without_history(o1), without_history(o2))
    return _result_nodes(call, desc, probes, grad, autocast, callbacks.hold)


def _refuse_in_place(fn, op, args, kwargs):
    """Raise the in-place error for an operation that writes into its
    input (add_, out=, inplace=True): a recorded graph cannot."""
    if (op.endswith("_") and not op.startswith("__") and op not in ("__", "_")) \
            or op in INPLACE_DUNDERS:
        raise inplace_error(f"{display_name(fn)}()", _node_or_none(args[0]) if args else None)
    if kwargs.get("out") is not None:
        raise inplace_error(f"{display_name(fn)}(..., out=...)")
    if kwargs.get("inplace") or (op in INPLACE_ARG and inplace_positional(fn, args, kwargs)):
        raise inplace_error(f"{display_name(fn)}(..., inplace=True)",
                            _node_or_none(args[0]) if args else None)


def _scan_call(fn, op, args, kwargs, name, module):
    """The call with its arguments scanned: the lazy ones, the batch they
    share (a LazyError if they hold different batches), their parents."""
    call = _Call(fn, op, args, kwargs, name, user_line(), module)
    call.targs = scan_args(args, call.nodes, call.plains, call.bints, call.eager)
    call.tkw = scan_args(kwargs, call.nodes, call.plains, call.bints, call.eager)
    Bs = {n.B for n in call.nodes + call.eager if n.B is not None} | {b.batch for b in call.bints}
    if len(Bs) > 1:
        raise LazyError(
            f"memfit.lazy: {name} at {call.where} combines lazy tensors with different batch "
            f"sizes {sorted(Bs)}; lazy tensors used together must hold the same samples"
        )
    call.B = Bs.pop() if Bs else None
    call.allow = any(n.allow for n in call.nodes)
    call.parents = tuple(dict.fromkeys(call.nodes))
    call.mixes = next((n.mixes for n in call.parents if n.mixes), None)
    for a in list(args) + list(kwargs.values()):
        call.first = _node_or_none(a)
        if call.first is not None:
            break
    call.first_arg_lazy = bool(args) and type(args[0]) is Node
    call.batched_parents = [n for n in call.parents if n.state == "batched"]
    return call


def _mixed(call, error):
    """A mixing error: raised, or kept in call.mixes where the user allowed
    mixing."""
    if not call.allow:
        raise error
    call.mixes = call.mixes or str(error)


def _check_batch_use(call):
    """Checks of a call over a batch of two or more: no reduced value meets
    per-sample ones again, no mixing of samples; a getitem's index and a
    bare squeeze() made to follow the chunk, and plain tensors beside the
    batch given their rule."""
    fn, op, args, kwargs, where = call.fn, call.op, call.args, call.kwargs, call.where
    first, batched_parents = call.first, call.batched_parents
    # A value reduced over the batch must not meet per-sample values again.
    reduced = [n for n in call.parents if n.state == "reduced"]
    if reduced and (batched_parents or call.bints):
        r = reduced[0]
        _mixed(call, mix_error(
            f"{r.name} at {r.where} reduces over the batch dimension and its result "
            f"is combined with per-sample values in {call.name}", f"at {where}"))
    if call.module is None:
        try:
            check_mixing(fn, op, args, kwargs, first, batched_parents, where)
        except LazyError as e:
            _mixed(call, e)
        if op == "getitem" and call.first_arg_lazy and first.state == "batched":
            try:
                call.targs = (call.targs[0], getitem_analysis(first, call.targs[1], where)) \
                    + tuple(call.targs[2:])
            except LazyError as e:
                _mixed(call, e)
    if op == "squeeze" and call.first_arg_lazy and first.state == "batched" and \
            len(args) == 1 and "dim" not in kwargs:
        # squeeze() would drop the batch dimension of a one-sample chunk:
        # squeeze exactly the dimensions that are 1 for the full batch.
        call.fn = fn = _squeeze_dims
        bd = bdim_set(first)
        call.targs = (call.targs[0], tuple(d for d, n in enumerate(first.shape)
                                           if n == 1 and d not in bd))
    constants = {id(n.value) for n in call.eager}
    plains = [t for t in call.plains if id(t) not in constants]
    mapping = plain_rules(fn, op, call.targs, call.tkw, args, kwargs, plains,
                          first if first is not None and first.state == "batched"
                          else (batched_parents[0] if batched_parents else None),
                          call.B, where, call.module)
    if mapping:
        call.targs = replace_plains(call.targs, mapping)
        call.tkw = replace_plains(call.tkw, mapping)


def _run_probes(call, sizes):
    """The call run on the first samples of each probe size, on the probes
    of its parents, leaving no trace; a failure is a LazyError naming the
    call and the size."""
    for p in call.parents:
        ensure_probe(p)
    outs = []
    with leaving_no_trace([call.module] if call.module is not None else []):
        for i, p in enumerate(sizes):
            ctx = ProbeCtx(i, p)
            try:
                outs.append(call.fn(*subst(call.targs, ctx), **subst(call.tkw, ctx)))
            except (OutOfMemoryError, LazyError):
                raise
            except Exception as e:
                hint = ""
                if any(type(v) is int and v in (call.B, 2 * call.B)
                       for v in flatten_args(call.args)):
                    hint = (" A shape argument equal to the batch size must come from "
                            "x.size(d) or x.shape[d], so that it follows the chunk.")
                raise LazyError(
                    f"memfit.lazy: {call.name} at {call.where} failed when tried on the first "
                    f"{p} samples (memfit runs each recorded operation on a few samples to "
                    f"learn its shapes): {type(e).__name__}: {e}.{hint}"
                ) from e
    return outs


def _python_value(call, o1, o2, sizes, read):
    """A call whose result holds no tensor: a Python value. Metadata
    (is_floating_point, is_contiguous, a size) is the probes'; a value of
    the data (torch.equal, allclose) is computed on the full batch now."""
    if call.op not in DATA_VALUED:
        try:
            return rebuild(o1, o2, sizes, call.B, call.fn, (), None)
        except LazyError:
            pass
    return call.fn(*materialize_args(call.targs, read), **materialize_args(call.tkw, read))


def _result_nodes(call, desc, probes, grad, autocast, hold):
    """The recorded result: one op Node for a tensor result, or an item
    Node for each tensor of a structured one (a tuple, a dict), each held;
    `probes` None when `desc` came from the probe cache."""
    node = Node("op")
    node.fn, node.args, node.kwargs = call.fn, call.targs, call.tkw
    node.parents = call.parents
    node.name, node.op, node.where = call.name, call.op, call.where
    node.B, node.allow = call.B, call.allow
    node.grad, node.autocast = grad, autocast
    node.module = call.module
    node.mixes = call.mixes
    node.cached = probes is None

    def finish(n, info):
        apply_info(n, info)
        if info.why:
            if not call.allow:
                raise mix_error(info.why, f"at {call.where}")
            n.mixes = n.mixes or info.why
        if n.state == "reduced" and call.batched_parents:
            root_kind(n, call.fn, call.op, call.args, call.kwargs, call.targs, call.tkw,
                      call.first)

    if type(desc) is ResultInfo:
        finish(node, desc)
        node.probe = probes or ()
        return hold(node)

    node.state = "struct"
    node.probe = probes or ()

    def make(path, info):
        item = Node("item")
        item.parent = node
        item.parents = (node,)
        item.path = path
        item.name = f"{call.name}{''.join(f'[{p!r}]' for p in path)}"
        item.op = "item"
        item.where, item.B, item.allow, item.mixes = call.where, call.B, call.allow, call.mixes
        item.grad, item.autocast = grad, autocast
        item.cached = node.cached
        finish(item, info)
        if probes is not None:
            item.probe = tuple(pluck(o, path) for o in probes)
        return hold(item)

    return rebuild_skel(desc, make, ())


def _squeeze_dims(t, dims):
    for d in sorted(dims, reverse=True):
        t = t.squeeze(d)
    return t


_squeeze_dims.memfit_op = "squeeze"
_squeeze_dims.memfit_display = "Tensor.squeeze"


def _has_bool_lazy_index(targs):
    if len(targs) < 2:
        return False
    idx = targs[1] if type(targs[1]) is tuple else (targs[1],)
    return any(type(e) is Node and e.dtype == torch.bool for e in idx)


def _wrap_eager(out, B, allow, name, where, hold):
    """Results computed at once (no batch to split): held Nodes that hold
    their value."""

    def wrap(o):
        if isinstance(o, torch.Tensor):
            n = Node("leaf")
            n.value = o
            n.state = "eager"
            n.B, n.allow, n.name, n.where = B, allow, name, where
            n.shape = tuple(o.shape)
            n.dtype, n.device, n.requires_grad = o.dtype, o.device, o.requires_grad
            return hold(n)
        if isinstance(o, (tuple, list)):
            return make_seq(type(o), [wrap(x) for x in o])
        if isinstance(o, dict):
            return type(o)({k: wrap(v) for k, v in o.items()})
        return o

    return wrap(out)


def make_leaf(tensor, batch, allow, device=None):
    """The leaf Node for a tensor given to memfit.lazy(); with `device`, a
    tensor on the host stays there and its chunks move to `device` as they
    run (see placement.py)."""
    moves = device is not None and on_host(tensor, device)
    n = Node("leaf")
    n.value = tensor
    n.where = user_line()
    n.allow = allow
    n.name = "memfit.lazy input"
    n.dtype, n.device, n.requires_grad = tensor.dtype, tensor.device, tensor.requires_grad
    n.shape = tuple(tensor.shape)
    if moves:
        n.device = device
    if batch is not None:
        n.B = tensor.shape[batch]
        n.leaf_dim = batch
    sizes = probe_sizes(n.B)
    if not sizes:
        n.state = "eager"  # no batch, or one sample: on the device whole, now
        n.value = to_device(tensor, device) if moves else tensor
        return n
    n.state = "batched"
    n.bdims = ((batch, 1),)
    if moves:
        n.to_device = device
        n.probe = tuple(to_device(tensor.narrow(batch, 0, p), device) for p in sizes)
    else:
        n.probe = tuple(tensor.narrow(batch, 0, p) for p in sizes)  # views: see ProbeCtx
    return n
