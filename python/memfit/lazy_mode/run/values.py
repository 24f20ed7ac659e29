"""Reading values: the full value of a lazy tensor, computed in chunks and
concatenated, or combined from chunks for a reduction.
"""

import torch

from ..graph.probe import drop_probes
from .buffers import written_buffers
from .chunk_loop import drive_chunks
from .chunk_weights import prepare_weights, chunk_weight, weight_targets
from .chunking import plan_limit, graph_signature
from .execute import (collect_nodes, execute_nodes, lazy_inputs, measured_modules,
                      measurement_overrides)
from .loss import analyze_loss, eval_tail
from .memory import device_available, node_nbytes
from .run_info import LazyRun, set_last_run

__all__ = ["read"]


def read(node, grad=False):
    """The full value of a lazy node (cached): see memfit.lazy."""
    if node.state == "eager":
        return node.value
    if node.value is not None and not (grad and node.requires_grad):
        return node.value
    drop_probes(node)
    B = node.B
    whole_grad = grad and node.requires_grad and torch.is_grad_enabled()
    info = LazyRun("eager" if whole_grad else "read", B)
    try:
        return _read_top(node, whole_grad, info)
    finally:
        set_last_run(info)


def _read_top(node, whole_grad, info):
    B = node.B
    if whole_grad:
        # A value to backpropagate through by hand: exactly eager, whole.
        info.whole = "a result that needs gradients runs whole"
        order, sources, counts = collect_nodes([node], train=True)
        v = execute_nodes(order, sources, counts, {node}, 0, B, B, True)[node]
        info.chunks.append((0, B))
        node.value = v.detach()
        return v
    with torch.no_grad():
        v = _read(node, info)
    node.value = v
    return v


def _read(T, info, overrides=None):
    B = T.B
    order, sources, counts = collect_nodes([T], False, overrides)
    mixes = next((n.mixes for n in order if n.mixes and n not in sources), None)
    if mixes:
        info.whole = f"runs whole: {mixes}"
        return _read_whole(T, order, sources, counts, B, info, overrides)
    if T.state == "batched":
        bd = T.single_bdim()
        if bd is None:
            info.whole = "the batch dimension is interleaved or data-dependent"
            return _read_whole(T, order, sources, counts, B, info, overrides)
        return _read_batched(T, bd, order, sources, counts, B, info, overrides)
    if T.state == "reduced":
        plan = analyze_loss(T, train=False, overrides=overrides)
        if plan.problem is None and plan.roots:
            return _read_reduced(T, plan, info, overrides)
        return _read_frontier(T, plan, info, overrides)
    # struct or constant
    return _read_whole(T, order, sources, counts, B, info, overrides)


def _read_whole(T, order, sources, counts, B, info, overrides):
    def attempt(start, size, only):
        return execute_nodes(order, sources, counts, {T}, 0, B, B, False, overrides)[T]

    box = []
    drive_chunks(B, B, attempt, lambda s, n, r: box.append(r), info, can_split=False,
           what=f"{T.name}", buffers=written_buffers(measured_modules(order)))
    return box[0]


def _read_limit(info, order, sources, counts, keep, B, device, out_per_sample, overrides):
    avail = device_available(device)
    if avail is None:
        return None
    sig = graph_signature(order, sources, "read", (len(keep), out_per_sample)) \
        if overrides is None else None

    def measure(p):
        over = measurement_overrides(order, sources, p, overrides)

        def run():
            execute_nodes(order, sources, counts, keep, 0, p, B, False, over)

        return run

    limit, entry = plan_limit(info, B, device, sig, measure, out_per_sample,
                          modules=measured_modules(order))
    return limit


def _read_batched(T, bd, order, sources, counts, B, info, overrides):
    d, k = bd
    per_sample = node_nbytes(T) / B
    limit = _read_limit(info, order, sources, counts, {T}, B, T.device, per_sample, overrides)
    info.chunk_limit = limit
    parts = []
    # In chunks, the result is allocated first and each chunk copied in:
    # no concatenation at the end, which would need the result twice.
    out = torch.empty(T.shape, dtype=T.dtype, device=T.device) \
        if limit is not None and limit < B else None

    def attempt(start, size, only):
        v = execute_nodes(order, sources, counts, {T}, start, size, B, False, overrides)[T]
        if out is None:
            return v
        out.narrow(d, k * start, k * size).copy_(v)
        return None

    drive_chunks(B, limit, attempt, lambda s, n, r: parts.append(r), info, what=f"{T.name}",
           inputs=lazy_inputs(order, sources), buffers=written_buffers(measured_modules(order)))
    if out is not None:
        return out
    return parts[0] if len(parts) == 1 else torch.cat(parts, d)


def _read_reduced(T, plan, info, overrides):
    B = T.B
    weights = prepare_weights(plan.roots, read)
    targets = weight_targets(weights)
    order, sources, counts = collect_nodes(plan.roots + targets, False, overrides)
    keep = set(plan.roots) | set(targets)
    limit = _read_limit(info, order, sources, counts, keep, B, T.device, 0, overrides)
    info.chunk_limit = limit
    acc = {}

    def attempt(start, size, only):
        vals = execute_nodes(order, sources, counts, keep, start, size, B, False, overrides)
        out = []
        for r in plan.roots:
            w = chunk_weight(weights[r], vals, start, size, B, vals[r].dtype)
            v = vals[r] if w is None else vals[r] * w
            out.append(v if r not in acc else acc[r] + v)
        return out

    def commit(start, size, result):
        for r, v in zip(plan.roots, result):
            acc[r] = v

    drive_chunks(B, limit, attempt, commit, info, what=f"{T.name}",
           inputs=lazy_inputs(order, sources), buffers=written_buffers(measured_modules(order)))
    for r in plan.roots:
        if r.held() and r.value is None:
            r.value = acc[r]
    if T in acc:
        return acc[T]
    return eval_tail(plan, acc, grad=False)


def _read_frontier(T, plan, info, overrides):
    """A reduction memfit cannot add up chunk by chunk (a max over the
    batch, a module returning a scalar...): compute its batched inputs in
    chunks, then the rest whole."""
    B = T.B
    frontier = []
    for r in plan.roots:
        parents = r.parent.parents if r.kind == "item" else r.parents
        frontier.extend(p for p in parents if p.state == "batched")
    frontier = list(dict.fromkeys(frontier))
    over = dict(overrides or {})
    if all(f.single_bdim() is not None for f in frontier):
        for f in frontier:
            sub = LazyRun("read", B)
            over[f] = _read(f, sub, overrides)
            info.chunks.extend(sub.chunks)
            info.ooms += sub.ooms
    else:
        info.whole = "a reduction over a batch dimension that cannot be split"
    order, sources, counts = collect_nodes([T], False, over)
    return _read_whole(T, order, sources, counts, B, info, over)
