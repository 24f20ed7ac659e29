"""LazyTensor.backward(): the chunked backward of a lazy loss, weighted so that
the accumulated gradients equal the full batch's (steps 1-4 in the lazy_run
package docstring), or of a batched result with a gradient.
"""

import math

import torch

from ..graph.errors import LazyError, OutOfMemoryError
from ..graph.node import Node
from ..graph.probe import drop_probes
from .buffers import BufferSnapshot, written_buffers
from .chunk_loop import drive_chunks
from .chunk_weights import prepare_weights, chunk_weight
from .chunking import checking_first_chunk, learn_from_ooms, plan_limit, graph_signature
from .execute import (collect_nodes, execute_nodes, lazy_inputs, measured_modules,
                      measurement_overrides)
from .grad_bookkeeping import grad_candidates, retain_needed
from .loss import analyze_loss, eval_tail, unsupported
from .memory import device_available, node_nbytes, new_grad_bytes
from .run_info import LazyRun, set_last_run
from .values import read

__all__: list = []


def backward(T, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """LazyTensor.backward on its node T: see memfit.lazy. `gradient` is a
    tensor or a Node; `inputs` real tensors (LazyTensor.backward unwraps)."""
    if create_graph:
        raise LazyError(
            "memfit.lazy: backward(create_graph=True) (higher-order gradients) is not "
            "supported on lazy tensors: use memfit.eager(t) and torch.autograd"
        )
    if isinstance(inputs, torch.Tensor):
        inputs = [inputs]
    if type(gradient) is Node:
        gradient = read(gradient)
    if T.state == "eager":
        info = LazyRun("backward", T.B)
        info.whole = "computed when recorded (one sample, or no batch dimension)"
        info.chunks = [(0, T.B)] if T.B else []
        set_last_run(info)
        T.value.backward(gradient, retain_graph, create_graph, inputs)
        return
    if not T.requires_grad:
        raise RuntimeError(
            "element 0 of tensors does not require grad and does not have a grad_fn"
        )
    if gradient is None and T.shape is not None and math.prod(
            s for s in T.shape if s is not None) != 1:
        raise RuntimeError("grad can be implicitly created only for scalar outputs")
    order, sources, _ = collect_nodes([T], train=True)
    through = [n for n in order if n not in sources and n.requires_grad]
    if any(n.backward_done for n in through):
        raise RuntimeError(
            "Trying to backward through the graph a second time (memfit.lazy: a backward "
            "already went through this lazy loss's graph, and eager PyTorch would have freed "
            "it). Specify retain_graph=True in the first backward() if you need to backward "
            "through the graph a second time"
        )
    drop_probes(T)
    info = LazyRun("backward", T.B)
    try:
        _backward(T, gradient, retain_graph, inputs, info)
    finally:
        set_last_run(info)  # internal reads (targets, masks) must not hide it
    if not retain_graph:
        for n in through:
            n.backward_done = True


# Note [A second backward through a lazy graph]
# Eager PyTorch frees a graph's saved tensors in backward, so a second
# backward through it raises, unless the first passed retain_graph=True.
# memfit.lazy recomputes each chunk's graph and could go through it again,
# adding the gradients twice: a loop that calls backward() twice on one
# loss would silently train on doubled gradients. So lazy says what eager
# says: each node a backward went through without retain_graph is marked,
# and a later backward through any of them raises the same RuntimeError.


def _backward(T, gradient, retain_graph, inputs, info):
    B = T.B
    if T.state == "batched":
        _backward_batched(T, gradient, inputs, info)
        return
    plan = analyze_loss(T, train=True)
    if plan.problem and not plan.mixes:
        if not T.allow:
            raise unsupported(plan, f"the loss {T.name}")
        plan.mixes = plan.problem
    order, sources, counts = collect_nodes([T], train=True)
    retain = bool(retain_graph) or retain_needed(order, sources)
    device = T.device
    held = [n for n in order if n not in sources and n is not T and n.held()
            and n.state == "batched" and n.single_bdim() is not None]
    avail = device_available(device)
    held_bytes = sum(node_nbytes(h) for h in held)
    if avail is not None and held_bytes > 0.1 * avail:
        held = []  # too big to keep: reading them later recomputes them

    if plan.mixes:
        info.whole = f"runs whole: {plan.mixes}"
        _whole_backward(T, gradient, inputs, retain, order, sources, counts, held, B, info)
        return

    # Plan first, so that what the setup below allocates (a target count,
    # gradients of plain terms) is not mistaken for memory that was there.
    grad_roots = list(plan.grad_roots)
    targets = [r.rinfo["target"] for r in grad_roots
               if r.rkind == "classes" and type(r.rinfo["target"]) is Node]
    corder, csources, ccounts = collect_nodes(grad_roots + targets, train=True)
    held = [h for h in held if h in ccounts or h in grad_roots]
    keep = set(grad_roots) | set(targets) | set(held)
    cands = None
    limit = entry = None
    reserve = 0
    if avail is not None and grad_roots:
        cands = grad_candidates(corder, csources, inputs)
        sig = graph_signature(corder, csources, "train",
                         (tuple(sorted(r.rkind or "" for r in grad_roots)), len(held)))

        def measure(p):
            over = measurement_overrides(corder, csources, p)

            def run():
                vals = execute_nodes(corder, csources, ccounts, keep, 0, p, B, True, over)
                terms = [_term(vals[r], None, None) for r in grad_roots]
                vals = None
                loss = terms[0] if len(terms) == 1 else sum(terms)
                terms = None
                req = [t for t in cands if t.requires_grad]
                if req and loss.requires_grad:
                    return torch.autograd.grad(loss, req, allow_unused=True,
                                               retain_graph=retain)
                return None

            return run

        per_sample = sum(node_nbytes(h) for h in held) / B
        reserve = new_grad_bytes(cands)
        limit, entry = plan_limit(info, B, device, sig, measure, per_sample, reserve,
                                  measured_modules(corder))
    info.chunk_limit = limit

    # Constant roots (no gradient: a mask count, a target count), chunk
    # weights, and d loss / d root.
    const_vals = {r: read(r) for r in plan.const_roots}
    weights = prepare_weights(grad_roots, read)
    trivial = len(plan.roots) == 1 and plan.roots[0] is T
    if trivial:
        coefs = {T: gradient}
    else:
        coefs = _tail_coefficients(plan, const_vals, gradient, inputs, retain)
    grad_roots = [r for r in grad_roots if coefs.get(r) is not None or trivial]
    if not grad_roots:
        # nothing reaches a gradient through the batch: only the value is left
        if T.value is None:
            T.value = read(T)
        return

    acc = {}
    held_chunks = {h: [] for h in held}

    def attempt(start, size, only):
        vals = execute_nodes(corder, csources, ccounts, keep, start, size, B, True)
        terms, rvals = [], []
        for r in grad_roots:
            w = chunk_weight(weights[r], vals, start, size, B, vals[r].dtype)
            R = vals[r]
            terms.append(_term(R, coefs.get(r), w))
            rvals.append(R.detach() if w is None else R.detach() * w)
        hv = [vals[h].detach() for h in held]
        vals = None
        loss = terms[0] if len(terms) == 1 else sum(terms)
        terms = None
        targets = only if only is not None else inputs
        if targets is None or len(targets) > 0:
            if loss.requires_grad:
                torch.autograd.backward(loss, inputs=targets, retain_graph=retain)
        loss = None
        # New totals are made here, inside the attempt: an OOM while adding
        # them up redoes the chunk's forward (its gradients, all accumulated,
        # are not owed any more) instead of escaping half-counted.
        return [v if r not in acc else acc[r] + v for r, v in zip(grad_roots, rvals)], hv

    def commit(start, size, result):
        totals, hv = result
        for r, v in zip(grad_roots, totals):
            acc[r] = v
        for h, v in zip(held, hv):
            held_chunks[h].append(v)

    if limit is None or limit >= B:
        info.whole = "fits" if limit is not None else "no memory limit known (no budget)"
    attempt = checking_first_chunk(attempt, entry, min(limit or B, B), device, reserve)
    final = drive_chunks(B, limit, attempt, commit, info, cands=cands, what=f"the loss {T.name}",
                   inputs=lazy_inputs(corder, csources),
                   buffers=written_buffers(measured_modules(corder)))
    learn_from_ooms(entry, info, limit, final)
    try:
        _keep_values(T, plan, grad_roots, acc, const_vals, held_chunks)
    except OutOfMemoryError:
        pass  # the gradients are complete; values are recomputed if read


def _keep_values(T, plan, grad_roots, acc, const_vals, held_chunks):
    """The loss value, and the values of lazy tensors the user still holds."""
    for r in grad_roots:
        if r.held() or r is T:
            r.value = acc[r]
    if T.value is None:
        values = dict(const_vals)
        values.update(acc)
        T.value = eval_tail(plan, values, grad=False)
    for h, parts in held_chunks.items():
        if parts:
            d, k = h.single_bdim()
            h.value = parts[0] if len(parts) == 1 else torch.cat(parts, d)


def _term(R, G, w):
    """The chunk loss term of root value R: G-weighted, times chunk weight w."""
    if G is None:
        t = R if R.numel() == 1 else R.sum()
    elif isinstance(G, torch.Tensor) and G.numel() > 1:
        t = (R * G).sum()
    else:
        t = R * G
        if t.numel() != 1:
            t = t.sum()
    if w is not None:
        t = t * w
    return t


def _tail_coefficients(plan, const_vals, gradient, inputs, retain):
    """d loss / d root for each root needing gradients, by evaluating the
    (linear) tail once on zeros; also accumulates, once, the gradients of
    plain tensors that the tail adds in (a weight-decay term...)."""
    values = dict(const_vals)
    dummies = {}
    for r in plan.grad_roots:
        z = torch.zeros(r.shape, dtype=r.dtype, device=r.device, requires_grad=True)
        dummies[r] = z
        values[r] = z
    L = eval_tail(plan, values, grad=True)
    ins = None
    if inputs is not None:
        ins = list(inputs) + list(dummies.values())
    torch.autograd.backward(L, gradient, inputs=ins, retain_graph=retain)
    coefs = {}
    for r, z in dummies.items():
        g = z.grad
        if g is not None and bool((g != 0).any()):
            coefs[r] = g if g.numel() > 1 else g.reshape(())
    return coefs


def _whole_backward(T, gradient, inputs, retain, order, sources, counts, held, B, info):
    keep = {T} | set(held)
    kept = BufferSnapshot(written_buffers(measured_modules(order)))
    kept.take()
    try:
        vals = execute_nodes(order, sources, counts, keep, 0, B, B, True)
        Tv = vals.pop(T)
        for h in held:
            h.value = vals[h].detach()
        vals = None
        torch.autograd.backward(Tv, gradient, inputs=inputs, retain_graph=retain)
    except OutOfMemoryError:
        # See Note [A failed chunk leaves no trace] (buffers.py).
        info.ooms += 1
        vals = Tv = None
        kept.restore()
        raise
    info.chunks.append((0, B))
    T.value = Tv.detach()


def _backward_batched(T, gradient, inputs, info):
    """out.backward(gradient) for a batched out: chunks of out with the
    matching slices of gradient; no weighting needed."""
    order, sources, counts = collect_nodes([T], train=True)
    mixes = next((n.mixes for n in order if n.mixes and n not in sources), None)
    retain = retain_needed(order, sources)
    B = T.B
    bd = T.single_bdim()
    if mixes or bd is None:
        info.whole = f"runs whole: {mixes or 'batch dimension not splittable'}"
        _whole_backward(T, gradient, inputs, retain, order, sources, counts, [], B, info)
        return
    d, k = bd
    if gradient is None or not isinstance(gradient, torch.Tensor) or \
            gradient.dim() != len(T.shape):
        raise RuntimeError("grad can be implicitly created only for scalar outputs")
    keep = {T}
    cands = None
    limit = None
    if device_available(T.device) is not None:
        cands = grad_candidates(order, sources, inputs)
        sig = graph_signature(order, sources, "train-out", None)

        def measure(p):
            over = measurement_overrides(order, sources, p)

            def run():
                v = execute_nodes(order, sources, counts, keep, 0, p, B, True, over)[T]
                req = [t for t in cands if t.requires_grad]
                if req:
                    return torch.autograd.grad(v, req, gradient.narrow(d, 0, k * p),
                                               allow_unused=True, retain_graph=retain)
                return None

            return run

        reserve = new_grad_bytes(cands)
        limit, entry = plan_limit(info, B, T.device, sig, measure, 0, reserve,
                                  measured_modules(order))
    else:
        entry = None
    info.chunk_limit = limit

    def attempt(start, size, only):
        v = execute_nodes(order, sources, counts, keep, start, size, B, True)[T]
        g = gradient if size == B else gradient.narrow(d, k * start, k * size)
        targets = only if only is not None else inputs
        if targets is None or len(targets) > 0:
            torch.autograd.backward(v, g, inputs=targets, retain_graph=retain)
        return None

    if entry is not None:
        attempt = checking_first_chunk(attempt, entry, min(limit or B, B), T.device, reserve)
    final = drive_chunks(B, limit, attempt, lambda s, n, r: None, info, cands=cands,
                   what=f"the backward of {T.name}", inputs=lazy_inputs(order, sources),
                   buffers=written_buffers(measured_modules(order)))
    learn_from_ooms(entry, info, limit, final)
