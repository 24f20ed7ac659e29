"""Probes: what running an operation on the first p1 and p2 samples tells of
its result (batch dimensions, full shape, layout, mixing), and computing
probe values when a node filled from the probe cache needs them.
"""

import contextlib

import torch

from ..._step.user_state import kept_rng
from .autocast import autocast_ctx
from .errors import LazyError
from .names import display_name
from .node import probe_sizes
from .placement import to_device
from .template import ProbeCtx, pluck, subst

__all__: list = []


class ResultInfo:
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


def _info_from(t1, t2, sizes, B, op, name, data_dep, derived):
    """What the two probe results t1, t2 (for sizes[0] and sizes[1] samples)
    say about a tensor result: batch dimensions, full shape, layout, and
    `why` it mixes samples (None if it does not)."""
    info = ResultInfo()
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


def describe_result(o1, o2, sizes, B, op, name, data_dep, derived, fn):
    """The skeleton of a probe result: ResultInfo for tensors, plain values
    elsewhere, containers kept."""
    if isinstance(o1, torch.Tensor):
        return _info_from(o1, o2, sizes, B, op, name, data_dep, derived)
    if isinstance(o1, (tuple, list)):
        return _Seq(type(o1), [describe_result(a, b, sizes, B, op, name, data_dep, derived, fn)
                               for a, b in zip(o1, o2)])
    if isinstance(o1, dict):
        return _Map(type(o1), {k: describe_result(o1[k], o2[k], sizes, B, op, name, data_dep,
                                            derived, fn) for k in o1})
    return _scalar_result(o1, o2, sizes, B, fn)


def rebuild_skel(skel, make, path):
    if type(skel) is ResultInfo:
        return make(path, skel)
    if type(skel) is _Seq:
        items = [rebuild_skel(x, make, path + (i,)) for i, x in enumerate(skel.items)]
        return make_seq(skel.typ, items)
    if type(skel) is _Map:
        items = {k: rebuild_skel(v, make, path + (k,)) for k, v in skel.items.items()}
        try:
            return skel.typ(items)
        except Exception:
            return items
    return skel


def apply_info(n, info):
    n.state = info.state
    n.bdims, n.ragged, n.shape = info.bdims, info.ragged, info.shape
    n.interleaved = info.interleaved
    n.dtype, n.device, n.requires_grad = info.dtype, info.device, info.requires_grad


def has_tensor(o):
    if isinstance(o, torch.Tensor):
        return True
    if isinstance(o, (tuple, list)):
        return any(has_tensor(x) for x in o)
    if isinstance(o, dict):
        return any(has_tensor(x) for x in o.values())
    return False


def rebuild(o1, o2, sizes, B, fn, path, makers):
    """The user-visible result: the structure of o1 with lazy tensors."""
    if isinstance(o1, torch.Tensor):
        return makers(path)
    if isinstance(o1, (tuple, list)):
        items = [rebuild(a, b, sizes, B, fn, path + (i,), makers)
                 for i, (a, b) in enumerate(zip(o1, o2))]
        return make_seq(type(o1), items)
    if isinstance(o1, dict):
        items = {k: rebuild(o1[k], o2[k], sizes, B, fn, path + (k,), makers) for k in o1}
        try:
            return type(o1)(items)
        except Exception:
            return items
    return _scalar_result(o1, o2, sizes, B, fn)


def make_seq(typ, items):
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


@contextlib.contextmanager
def leaving_no_trace(modules):
    """A block that runs the user's modules on a few samples (probes,
    measurements), after which the RNG they drew from and the buffers they
    updated (BatchNorm's running statistics) are as before: the eager step
    draws and updates once, at full batch. See Note [A rehearsed step leaves
    no trace] (_step/user_state.py)."""
    buffers = {id(b): b for m in modules for b in m.buffers() if not b.is_meta}.values()
    saved = [(b, b.detach().clone()) for b in buffers]
    with kept_rng():
        try:
            yield
        finally:
            # By value: batch_norm updates its running statistics without
            # moving their version counter. Unchanged ones are not written,
            # so a graph that saved them stays valid.
            with torch.no_grad():
                for b, value in saved:
                    if not torch.equal(b, value):
                        b.copy_(value)


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
    with leaving_no_trace([n.module for n in todo if n.module is not None]):
        _run_probes(todo)


def without_history(o):
    """A probe result as kept on its node: its tensors cut from the autograd
    graph of the probe run (which holds that run's activations), still
    requiring grad where they did, so that later probes see it."""
    if isinstance(o, torch.Tensor):
        return o if o.grad_fn is None else o.detach().requires_grad_(o.requires_grad)
    if isinstance(o, (tuple, list)):
        return make_seq(type(o), [without_history(x) for x in o])
    if isinstance(o, dict):
        try:
            return type(o)({k: without_history(v) for k, v in o.items()})
        except Exception:
            return {k: without_history(v) for k, v in o.items()}
    return o


def drop_probes(node):
    """Free the probe values of `node` and its ancestors before the
    computation runs at full size: a step recorded with a cold probe cache
    would otherwise hold them beside the chunks, and need more memory than
    the eager step (see Note [Never worse than eager] in run/chunking.py).
    Nodes the user still holds keep theirs (a few samples' worth), so that
    recording from them does not run the forward again; ensure_probe
    computes the others again if a later recording needs them."""
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.held() and n is not node:
            # A later recording may start from it: keep what it saw. The node
            # computed now is held by the very tensor being computed; it gets
            # its full value.
            continue
        if n.kind != "leaf" or n.to_device is not None:  # a leaf's own probes are views
            n.probe = ()
        stack.extend(n.parents)


def _run_probes(todo):
    for n in todo:
        if n.kind == "leaf":
            n.probe = tuple(to_device(n.value.narrow(n.leaf_dim, 0, p), n.to_device)
                            for p in probe_sizes(n.B))
            continue
        if n.kind == "item":
            n.probe = tuple(pluck(v, n.path) for v in n.parent.probe)
            continue
        outs = []
        with torch.set_grad_enabled(n.grad):
            for i, p in enumerate(probe_sizes(n.B)):
                ctx = ProbeCtx(i, p)
                if n.autocast:
                    with autocast_ctx(n.autocast):
                        outs.append(n.fn(*subst(n.args, ctx), **subst(n.kwargs, ctx)))
                else:
                    outs.append(n.fn(*subst(n.args, ctx), **subst(n.kwargs, ctx)))
        n.probe = tuple(without_history(o) for o in outs)
