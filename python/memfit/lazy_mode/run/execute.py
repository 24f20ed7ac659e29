"""Running the recorded graph on one chunk of samples: the nodes to run, where
their inputs come from, and checking shapes taken from the probe cache.
"""

import collections
import dataclasses

import torch

from ..graph.autocast import autocast_ctx
from ..graph.errors import LazyError
from ..graph.placement import to_device
from ..graph.probe_cache import forget_probe
from ..graph.template import ChunkCtx, pluck, subst

__all__: list = []


def _usable_cache(n, train):
    """A node whose computed value can stand in for its subgraph."""
    if n.value is None:
        return False
    if train and n.requires_grad:
        return False  # gradients must flow through it: recompute
    if n.state == "batched":
        return n.single_bdim() is not None
    return True


def is_source(n, train, overrides):
    return (
        n.kind == "leaf"
        or n.state == "eager"
        or (overrides is not None and n in overrides)
        or _usable_cache(n, train)
    )


def collect_nodes(targets, train, overrides=None):
    """Nodes needed to compute `targets`, in recording order, and sources."""
    seen = set()
    order = []
    sources = set()
    stack = list(targets)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        order.append(n)
        if is_source(n, train, overrides):
            sources.add(n)
            continue
        stack.extend(n.parents)
    order.sort(key=lambda n: n.id)
    counts = collections.Counter()
    for n in order:
        if n not in sources:
            for p in n.parents:
                counts[p] += 1
    return order, sources, counts


def measurement_overrides(order, sources, size, overrides=None):
    """`overrides` plus, for each lazy input, a copy of its first `size`
    samples: what a measurement runs on, so that a forward writing into its
    input (x.mul_(2)) writes into memfit's copy, not the user's tensor. Made
    before the measurement's tracking starts: the chunks it plans run on
    views, which cost no memory."""
    out = dict(overrides or {})
    for n in order:
        if n in sources and n.kind == "leaf" and n.state == "batched" and n not in out \
                and n.to_device is None:  # a host batch's chunks are copies already
            out[n] = n.value.narrow(n.leaf_dim, 0, size).clone()
    return out


@dataclasses.dataclass
class BatchData:
    """The user's batched tensors a computation reads. resident: on the
    device, the chunks are views of them; host: kept on the host, each
    chunk is copied to the device (see graph/placement.py);
    host_sample_bytes: what one sample of the host tensors takes."""

    resident: list
    host: list
    host_sample_bytes: int = 0


def lazy_inputs(order, sources):
    """The user's batched tensors that the chunks of `order` read."""
    leaves = [n for n in order if n in sources and n.kind == "leaf" and n.state == "batched"]
    host = [n for n in leaves if n.to_device is not None]
    return BatchData(
        resident=[n.value for n in leaves if n.to_device is None],
        host=[n.value for n in host],
        host_sample_bytes=sum(n.value.numel() * n.value.element_size() // n.B for n in host),
    )


def measured_modules(order):
    """The modules a measurement of `order` runs."""
    return [n.module for n in order if n.module is not None]


def _source_value(n, start, size, B, overrides):
    if overrides is not None and n in overrides:
        v = overrides[n]
        if n.state != "batched":
            return v
        d, k = n.single_bdim()
    elif n.kind == "leaf" and n.state != "eager":
        v = n.value
        if n.to_device is not None:
            if not (start == 0 and size == B):
                v = v.narrow(n.leaf_dim, start, size)
            return to_device(v, n.to_device)
        d, k = n.leaf_dim, 1
    elif n.state != "batched":
        return n.value
    else:
        v = n.value
        d, k = n.single_bdim()
    if start == 0 and size == B:
        return v
    return v.narrow(d, k * start, k * size)


def execute_nodes(order, sources, counts, keep, start, size, B, train, overrides=None):
    """Run `order` on samples [start, start+size); returns the values of
    the nodes in `keep`. Values are dropped as soon as no later node needs
    them."""
    env = {}
    ctx = ChunkCtx(env, start, size)
    left = dict(counts)
    outer = torch.is_grad_enabled()
    now = outer
    try:
        for n in order:
            if n in sources:
                env[n] = _source_value(n, start, size, B, overrides)
                continue
            if n.kind == "item":
                env[n] = pluck(env[n.parent], n.path)
                if n.cached:
                    _check_cached(n, env[n], size)
            else:
                want = n.grad if train else False
                if want != now:
                    torch.set_grad_enabled(want)
                    now = want
                a = subst(n.args, ctx)
                kw = subst(n.kwargs, ctx)
                if n.autocast:
                    with autocast_ctx(n.autocast):
                        env[n] = n.fn(*a, **kw)
                else:
                    env[n] = n.fn(*a, **kw)
                a = kw = None
                if n.cached and n.state != "struct":
                    _check_cached(n, env[n], size)
            for p in n.parents:
                c = left[p] - 1
                left[p] = c
                if c == 0 and p not in keep:
                    env.pop(p, None)
    finally:
        if now != outer:
            torch.set_grad_enabled(outer)
    out = {n: env[n] for n in keep if n in env}
    env.clear()
    return out


def _check_cached(n, v, size):
    """A node whose shapes came from the probe cache: check them once
    against a real result (see Note [Probe cache] in graph/probe_cache.py)."""
    n.cached = False
    if not isinstance(v, torch.Tensor):
        return
    want = list(n.shape)
    for d, k in n.bdims:
        want[d] = k * size
    got = tuple(v.shape)
    if len(got) != len(want) or any(w is not None and w != g for w, g in zip(want, got)):
        forget_probe(n)
        raise LazyError(
            f"memfit.lazy: {n.describe()} returned shape {got} for {size} samples where "
            f"{tuple(want)} was expected from an earlier call with the same inputs; its "
            f"shapes depend on something memfit does not see (a module attribute?). The "
            f"cache of shapes is cleared: record the computation again."
        )
