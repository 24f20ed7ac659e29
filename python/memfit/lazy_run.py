"""Running recorded lazy computations: chunk size, chunked execution, loss
weighting, OOM recovery, and the values read back.

How a backward() on a lazy loss runs:

1. The loss is analysed: its "roots" are the nodes that reduce batched
   values (a mean, a sum, a loss function's reduction); the "tail" is what
   combines the roots into the loss (loss_a + 0.1 * loss_b). Each root says
   how chunk results add up: a sum adds, a mean weighs chunk i by c_i/B,
   cross_entropy/nll_loss with mean reduction by the share of counted
   targets (class weights and ignore_index included). The tail must be
   linear in the roots that need gradients (+, -, * and / by constants).
2. The chunk size: the largest c whose memory fits what is available
   (CUDA: free + cached; CPU: the simulated device's budget minus what is
   tracked now; no budget: one chunk), keeping a 10% margin. The memory of a
   chunk of c samples is measured once per graph signature by running
   forward+backward on the first 2 and 3 samples: on CPU the live bytes
   after every allocation are fitted as a + b*c (the step's peak may move
   from the gradients to the activations as c grows), on CUDA the peaks are
   (M0 + m*c). Later chunks run with the first chunk's .grad allocated, and
   are planned so.
3. Chunks run the recorded graph on narrowed leaves; each chunk's loss is
   sum_j G_j * w_ij * R_ij (G_j: d loss / d root j, w_ij the chunk weight), so
   accumulated gradients equal the full batch's.
4. An OOM in a chunk drops everything the chunk held, halves the chunk and
   redoes it. Parameters whose .grad the failed backward had already
   completed are left out of the redo (backward(inputs=the others)), so no
   sample is counted twice and none is dropped.
"""

import collections
import math
import traceback

import torch

from . import _memfit
from .lazy_graph import (
    Arange,
    forget_probe,
    BatchInt,
    LazyError,
    Node,
    OutOfMemoryError,
    Sliced,
    _pluck,
    subst,
)

#: Fraction of the available memory left unused when sizing chunks.
MARGIN = 0.10
#: Probe sizes used to measure memory per sample.
_MEASURE_SIZES = (2, 3)
_CACHE_MAX = 64
_cache = collections.OrderedDict()
_last_run = None


class LazyRun:
    """How memfit ran the last lazy computation (memfit.last_lazy_run()).

    kind: "backward", "read" or "eager"; batch: B; chunks: [(start, size)]
    of the chunks that completed, in order; ooms: OOMs recovered from;
    chunk_limit: the planned largest chunk (None: no limit known);
    bytes_per_sample, fixed_bytes: the fitted M(c) = fixed + per_sample*c
    (None when not measured); available_bytes: memory available when
    planning; margin: fraction kept free; measured: True if measured now
    (False: taken from the cache); whole: why it ran in one chunk, or None.
    """

    def __init__(self, kind, batch):
        self.kind = kind
        self.batch = batch
        self.chunks = []
        self.ooms = 0
        self.chunk_limit = None
        self.bytes_per_sample = None
        self.fixed_bytes = None
        self.available_bytes = None
        self.margin = MARGIN
        self.measured = False
        self.whole = None
        self._entry = None
        self._reserve = 0
        self._extra = 0.0

    def limit_for(self, available_bytes):
        """The chunk limit memfit would choose for the same computation with
        `available_bytes` free (from the fit measured for this run; None if
        nothing was measured)."""
        e = self._entry
        if e is None:
            return None
        usable = available_bytes * (1.0 - self.margin)
        c1, _ = _solve(e["first"], usable, self._extra)
        c2, _ = _solve(e["later"], usable - self._reserve, self._extra)
        c = min(c1, c2)
        if c != math.inf:
            c = int(c * e["scale"])
        return max(1, min(c, self.batch))

    def __repr__(self):
        sizes = [s for _, s in self.chunks]
        return (
            f"LazyRun(kind={self.kind!r}, batch={self.batch}, chunks={len(sizes)} {sizes}, "
            f"ooms={self.ooms}, chunk_limit={self.chunk_limit}, "
            f"bytes_per_sample={self.bytes_per_sample}, fixed_bytes={self.fixed_bytes}, "
            f"available_bytes={self.available_bytes}, whole={self.whole!r})"
        )


def last_run():
    """The LazyRun of the last lazy computation, or None."""
    return _last_run


def _set_last(info):
    global _last_run
    _last_run = info


# ---------------------------------------------------------------------------
# Graph walking


def _usable_cache(n, train):
    """A node whose computed value can stand in for its subgraph."""
    if n.value is None:
        return False
    if train and n.requires_grad:
        return False  # gradients must flow through it: recompute
    if n.state == "batched":
        return n.single_bdim() is not None
    return True


def _is_source(n, train, overrides):
    return (
        n.kind == "leaf"
        or n.state == "eager"
        or (overrides is not None and n in overrides)
        or _usable_cache(n, train)
    )


def _collect(targets, train, overrides=None):
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
        if _is_source(n, train, overrides):
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


class _ChunkCtx:
    __slots__ = ("env", "start", "size")

    def __init__(self, env, start, size):
        self.env, self.start, self.size = env, start, size

    def value(self, node):
        return self.env[node]


def _source_value(n, start, size, B, overrides):
    if overrides is not None and n in overrides:
        v = overrides[n]
        if n.state != "batched":
            return v
        d, k = n.single_bdim()
    elif n.kind == "leaf" and n.state != "eager":
        v, d, k = n.value, n.leaf_dim, 1
    elif n.state != "batched":
        return n.value
    else:
        v = n.value
        d, k = n.single_bdim()
    if start == 0 and size == B:
        return v
    return v.narrow(d, k * start, k * size)


def _autocast_ctx(ac):
    import contextlib

    stack = contextlib.ExitStack()
    for device_type, dtype in ac:
        stack.enter_context(torch.autocast(device_type=device_type, dtype=dtype))
    return stack


def _execute(order, sources, counts, keep, start, size, B, train, overrides=None):
    """Run `order` on samples [start, start+size); returns the values of
    the nodes in `keep`. Values are dropped as soon as no later node needs
    them."""
    env = {}
    ctx = _ChunkCtx(env, start, size)
    left = dict(counts)
    outer = torch.is_grad_enabled()
    now = outer
    try:
        for n in order:
            if n in sources:
                env[n] = _source_value(n, start, size, B, overrides)
                continue
            if n.kind == "item":
                env[n] = _pluck(env[n.parent], n.path)
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
                    with _autocast_ctx(n.autocast):
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
    against a real result (see Note [Probe cache] in lazy_graph)."""
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


# ---------------------------------------------------------------------------
# Loss analysis


_LINEAR_ONE = {
    "neg", "positive", "sum", "mean", "view", "reshape", "squeeze", "unsqueeze",
    "flatten", "clone", "contiguous", "getitem", "select", "T", "t", "transpose",
    "permute", "to", "float", "double", "half", "bfloat16", "expand", "expand_as",
    "view_as", "reshape_as", "detach", "item", "type", "type_as", "squeeze_",
    "broadcast_to", "narrow",
}
_LINEAR_MANY = {"add", "sub", "subtract", "rsub", "stack", "cat", "concat", "concatenate",
                "hstack", "vstack"}
_SCALE = {"mul", "multiply"}
_DIVIDE = {"div", "true_divide", "divide"}


def _is_root(n):
    if n.state != "reduced":
        return False
    parents = n.parent.parents if n.kind == "item" else n.parents
    return any(p.state == "batched" for p in parents)


class _Plan:
    def __init__(self, target):
        self.target = target
        self.B = target.B
        self.roots = []  # reduction roots, recording order
        self.tail = []  # nodes between the roots and the target
        self.problem = None  # why chunks cannot be combined (None: they can)
        self.mixes = None
        self.grad_roots = []
        self.const_roots = []


def _analyze(T, train, overrides=None):
    """Roots and tail of a reduced target (see module docstring)."""
    plan = _Plan(T)
    order, sources, _ = _collect([T], train, overrides)
    plan.mixes = next((n.mixes for n in order if n.mixes and n not in sources), None)
    if T.state != "reduced":
        return plan
    roots, tail, seen = [], [], set()
    stack = [T]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n is not T and _is_source(n, train, overrides):
            continue
        if n.state == "eager":
            continue
        if _is_root(n):
            roots.append(n)
            continue
        tail.append(n)
        stack.extend(p for p in n.parents if p.state in ("reduced", "struct"))
    roots.sort(key=lambda n: n.id)
    tail.sort(key=lambda n: n.id)
    plan.roots, plan.tail = roots, tail
    for r in roots:
        if r.rkind is None:
            plan.problem = (
                f"{r.name} at {r.where} reduces over the batch, but memfit knows how to add "
                f"up chunks only for sums, means and torch's loss functions (reduction "
                f"'mean', 'sum' or 'batchmean')"
            )
            break
    if train:
        plan.grad_roots = [r for r in roots if r.requires_grad]
        plan.const_roots = [r for r in roots if not r.requires_grad]
        if plan.problem is None:
            plan.problem = _check_linear(plan)
    return plan


def _depends(obj, dep):
    t = type(obj)
    if t is Node:
        return dep.get(obj, False)
    if t is tuple or t is list:
        return any(_depends(o, dep) for o in obj)
    if t is dict:
        return any(_depends(o, dep) for o in obj.values())
    return False


def _needs_grad(obj, dep):
    """A non-root operand that requires grad (makes a product bilinear)."""
    t = type(obj)
    if t is Node:
        return obj.requires_grad and not dep.get(obj, False)
    if t is tuple or t is list:
        return any(_needs_grad(o, dep) for o in obj)
    if isinstance(obj, torch.Tensor):
        return obj.requires_grad
    return False


def _check_linear(plan):
    """None if the loss is linear in the roots that need gradients;
    otherwise why not."""
    dep = {r: True for r in plan.grad_roots}
    for n in plan.tail:
        if n.kind == "item":
            dep[n] = dep.get(n.parent, False)
            continue
        operands = list(n.args) + list(n.kwargs.values())
        d = _depends(operands, dep)
        dep[n] = d
        if not d:
            continue
        op = n.op
        bad = None
        if op in _LINEAR_ONE:
            if _depends(operands[1:], dep):
                bad = "it combines two values computed from the batch"
        elif op in _LINEAR_MANY:
            pass
        elif op in _SCALE:
            deps = [o for o in operands if _depends(o, dep)]
            if len(deps) > 1:
                bad = "it multiplies two values computed from the batch"
            elif any(_needs_grad(o, dep) for o in operands if not _depends(o, dep)):
                bad = "the factor itself needs gradients"
        elif op in _DIVIDE:
            if _depends(operands[1:], dep):
                bad = "it divides by a value computed from the batch that needs gradients"
            elif _needs_grad(operands[1:], dep):
                bad = "the divisor itself needs gradients"
        elif op == "rdiv":
            bad = "it divides by the loss"
        else:
            bad = "it is not a sum, difference, or product with a constant"
        if bad:
            return (
                f"{n.name} at {n.where} is applied to the batch's reduced loss, and {bad}; "
                f"the gradients of chunks add up only when the loss is a sum or mean "
                f"over samples combined linearly (+, -, and * or / by constants)"
            )
    return None


def _unsupported(plan, what):
    return LazyError(
        f"memfit.lazy cannot split {what}: {plan.problem}. Pass allow_mixing=True to "
        f"memfit.lazy() to run it whole (one chunk, as eager PyTorch would), or "
        f"compute the loss as a sum/mean of per-sample terms."
    )


# ---------------------------------------------------------------------------
# Chunk weights


def _class_count(target, weight, ignore_index):
    valid = target != ignore_index
    if weight is None:
        return valid.sum()
    safe = torch.where(valid, target, torch.zeros_like(target))
    return (weight.to(target.device)[safe] * valid).sum()


def _full_target(tmpl):
    if type(tmpl) is Node:
        return read(tmpl)
    if type(tmpl) is Sliced:
        return tmpl.tensor
    return tmpl


def _prepare_weights(roots):
    """Per root: [kind, denominator, target template, weight, ignore_index].
    The denominator of a class-count weight (the full batch's counted
    targets) is computed when a chunk first needs it: a batch run in one
    chunk never does."""
    out = {}
    for r in roots:
        if r.rkind == "classes":
            info = r.rinfo
            weight = info["weight"]
            if type(weight) is Node:
                weight = read(weight)
            out[r] = ["classes", None, info["target"], weight, info["ignore_index"]]
        else:
            out[r] = [r.rkind, None, None, None, None]
    return out


def _weight(spec, env, start, size, B):
    """The weight of a chunk's root value (None: 1)."""
    kind, D, tmpl, weight, ignore = spec
    if kind == "sum":
        return None
    if kind == "mean":
        return None if size == B else size / B
    if size == B and start == 0:
        return None
    if D is None:
        D = spec[1] = _class_count(_full_target(tmpl), weight, ignore)
    target = subst(tmpl, _ChunkCtx(env, start, size))
    return _class_count(target, weight, ignore) / D


def _weight_targets(weights):
    return [spec[2] for spec in weights.values() if type(spec[2]) is Node]


# ---------------------------------------------------------------------------
# Memory: what is available, what a chunk needs


def _available(device):
    if device is None:
        return None
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type in ("cpu", "meta"):
        b = _memfit.budget(device.type)
        if b is None:
            return None
        return b - _memfit.tracked_live_bytes(device.type)
    return None


def _profile(device, fn):
    """Run fn() and describe its memory.

    CPU: the live bytes after each tracked allocation, twice: as measured
    ("first": gradients fn() returns are kept, as .grad is on a first
    backward) and with those gradient buffers freed as soon as made
    ("later": a backward accumulating into existing .grad), with the
    allocating ops to align two runs. CUDA: the peak above what was
    allocated before (both curves the same)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        return None, [peak], [peak]
    from .tracking import track

    with track() as t:
        kept = fn()
        persistent = {_memfit.allocation_id(g) for g in (kept or ()) if g is not None}
        kept = None
    events = t.timeline.events()
    del t
    live = held = 0
    alive = {}
    ops, first, later = [], [], []
    for kind, nbytes, ident, dev, _cat, _phase, _module, op in events:
        if dev != device.type:
            continue
        if kind == "alloc":
            alive[ident] = nbytes
            live += nbytes
            ops.append(op)
            first.append(live)
            later.append(live - held)
            if ident in persistent:
                held += nbytes
        elif ident in alive:
            n = alive.pop(ident)
            live -= n
            if ident in persistent:
                held -= n
    return ops, first or [0], later or [0]


def _fit_lines(prof1, prof2, p1, p2, which):
    """Memory as a function of the chunk size c: the most live bytes over
    the step's allocations, each fitted as a + b*c from two runs. When the
    two runs allocate in the same order (the usual case) this is exact for
    every allocation whose size is affine in c, and the peak's location may
    move with c (at 2 samples the peak is the gradients, at 200 the
    activations). Otherwise: a conservative fit of the peaks."""
    ops1, c1 = prof1[0], prof1[which]
    ops2, c2 = prof2[0], prof2[which]
    if ops1 is not None and ops1 == ops2:
        best = {}
        for a1, a2 in zip(c1, c2):
            b = (a2 - a1) / (p2 - p1)
            a = a1 - b * p1
            key = round(b, 6)
            if best.get(key, -math.inf) < a:
                best[key] = a
        return [(a, b) for b, a in best.items()], True
    peak1, peak2 = max(c1), max(c2)
    m = max((peak2 - peak1) / (p2 - p1), 1.0)
    M0 = max(peak1 - m * p1, 0.0)
    lines = [(M0, m)]
    if ops1 is not None:  # misaligned CPU runs: also bound by peak per sample
        lines.append((0.0, peak2 / p2))
    return lines, False


def _solve(lines, usable, extra_per_sample):
    """Largest c with a + (b + extra)*c <= usable for every line; and the
    (a, b) line that limits it."""
    c_best, limiting = math.inf, None
    for a, b in lines:
        b = b + extra_per_sample
        if b <= 0:
            if a > usable:
                return 0, (a, b)
            continue
        c = math.floor((usable - a) / b)
        if c < c_best:
            c_best, limiting = c, (a, b)
    if limiting is None:
        limiting = max(lines, key=lambda ab: ab[0])
    return c_best, limiting


def _argsig(obj, index):
    t = type(obj)
    if t is Node:
        return ("N", index.get(obj, -1))
    if t is tuple or t is list:
        return tuple(_argsig(o, index) for o in obj)
    if t is dict:
        return tuple((k, _argsig(v, index)) for k, v in obj.items())
    if t is BatchInt:
        return ("B", obj.k)
    if t is Sliced:
        s = list(obj.tensor.shape)
        s[obj.dim] = -obj.k
        return ("S", tuple(s), obj.tensor.dtype, obj.tensor.device.type)
    if t is Arange:
        return ("A",)
    if isinstance(obj, torch.Tensor):
        return ("T", tuple(obj.shape), obj.dtype, obj.device.type, obj.requires_grad)
    if obj is None or t in (bool, int, str):
        return obj
    if t is float:
        return "f"
    if isinstance(obj, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(obj)
    if isinstance(obj, slice):
        return ("sl", _argsig(obj.start, index), _argsig(obj.stop, index),
                _argsig(obj.step, index))
    return t.__name__


def _signature(order, sources, mode, extra):
    index = {n: i for i, n in enumerate(order)}
    parts = [mode, extra]
    for n in order:
        if n in sources:
            v = n.value
            shape = list(v.shape) if isinstance(v, torch.Tensor) else None
            if shape is not None and n.state == "batched":
                d = n.leaf_dim if n.kind == "leaf" else n.single_bdim()[0]
                shape[d] = -1
            parts.append(("src", n.state, str(n.dtype), str(n.device),
                          tuple(shape) if shape else None))
            continue
        if n.module is not None:
            key = (type(n.module), id(n.module),
                   tuple(id(p) for p in n.module.parameters()), n.module.training)
        else:
            key = n.fn
        parts.append((n.kind, key, _argsig(n.args, index), _argsig(n.kwargs, index),
                      n.path, n.grad if mode != "read" else None, n.autocast))
    return tuple(parts)


def _cache_get(sig):
    e = _cache.get(sig)
    if e is not None:
        _cache.move_to_end(sig)
    return e


def _cache_put(sig, entry):
    _cache[sig] = entry
    _cache.move_to_end(sig)
    while len(_cache) > _CACHE_MAX:
        _cache.popitem(last=False)


def _learn(entry, info, limit, final):
    """After an OOM, plan smaller chunks for this computation next time."""
    if entry is not None and info.ooms and limit:
        entry["scale"] = min(entry["scale"], max(final, 1) / limit)


def _itemsize(dtype):
    """Bytes per element, without allocating (a tracked allocation could be
    refused)."""
    size = getattr(dtype, "itemsize", None)  # torch >= 2.1
    if size:
        return size
    try:
        if dtype.is_complex:
            return 2 * torch.finfo(dtype).bits // 8
        if dtype.is_floating_point:
            return torch.finfo(dtype).bits // 8
        if dtype == torch.bool:
            return 1
        return torch.iinfo(dtype).bits // 8
    except TypeError:
        return 1


def _nbytes(n):
    total = _itemsize(n.dtype)
    for s in n.shape:
        total *= s if s is not None else 0
    return total


def _new_grad_bytes(cands):
    """Bytes of the .grad tensors the first backward will create and keep:
    later chunks run with them allocated."""
    return sum(p.numel() * p.element_size() for p in cands
               if p.requires_grad and p.grad is None)


def _limit(info, B, device, sig, measure, extra_per_sample=0.0, reserve=0):
    """Largest chunk that should fit (None: no limit known).

    measure(p) runs the step on p samples and returns the gradients it
    computed (see _profile). `reserve`: bytes of .grad the first chunk
    will create; the first chunk must fit as measured, later ones with the
    gradients already allocated. Returns (limit, cache entry or None)."""
    avail = _available(device)
    info.available_bytes = avail
    if avail is None:
        return None, None
    entry = _cache_get(sig) if sig is not None else None
    if entry is None:
        if B <= _MEASURE_SIZES[-1]:
            return B, None
        profs = []
        try:
            for p in _MEASURE_SIZES:
                profs.append(_profile(device, lambda: measure(p)))
        except OutOfMemoryError:
            # Even a few samples do not fit the way things are now: try one
            # sample at a time and let OOM recovery tell the rest.
            return 1, None
        first, exact = _fit_lines(profs[0], profs[1], *_MEASURE_SIZES, which=1)
        later, _ = _fit_lines(profs[0], profs[1], *_MEASURE_SIZES, which=2)
        entry = {"first": first, "later": later, "exact": exact, "scale": 1.0}
        if sig is not None:
            _cache_put(sig, entry)
        info.measured = True
    info._entry, info._reserve, info._extra = entry, reserve, extra_per_sample
    usable = avail * (1.0 - MARGIN)
    c1, lim1 = _solve(entry["first"], usable, extra_per_sample)
    c2, lim2 = _solve(entry["later"], usable - reserve, extra_per_sample)
    c, (a, b) = (c1, lim1) if c1 <= c2 else (c2, (lim2[0] + reserve, lim2[1]))
    info.bytes_per_sample = int(b)
    info.fixed_bytes = int(a)
    if c != math.inf:
        c = int(c * entry["scale"])
    return max(1, min(c, B)), entry


# ---------------------------------------------------------------------------
# Gradient bookkeeping for OOM recovery


def _grad_candidates(order, sources, user_inputs):
    """Every tensor whose .grad a chunk's backward may accumulate into."""
    if user_inputs is not None:
        return list(user_inputs)
    seen = {}

    def add(t):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            if t.is_leaf:
                seen.setdefault(id(t), t)
            else:
                _leaves_of(t, add)

    def scan(obj):
        t = type(obj)
        if t is tuple or t is list:
            for o in obj:
                scan(o)
        elif t is dict:
            for o in obj.values():
                scan(o)
        elif t is Sliced:
            add(obj.tensor)
        elif isinstance(obj, torch.Tensor):
            add(obj)

    for n in order:
        if n in sources:
            if isinstance(n.value, torch.Tensor):
                add(n.value)
            continue
        if n.module is not None:
            for p in n.module.parameters():
                add(p)
        scan(n.args)
        scan(n.kwargs)
    return list(seen.values())


def _leaves_of(t, add):
    stack = [t.grad_fn]
    seen = set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)
        if var is not None:
            add(var)
        stack.extend(f for f, _ in fn.next_functions)


def _retain_needed(order, sources):
    """True when a plain tensor with an autograd history is used, so each
    chunk's backward must keep that shared history."""

    def hist(obj):
        t = type(obj)
        if t is tuple or t is list:
            return any(hist(o) for o in obj)
        if t is dict:
            return any(hist(o) for o in obj.values())
        if t is Sliced:
            return obj.tensor.grad_fn is not None
        if isinstance(obj, torch.Tensor):
            return obj.grad_fn is not None
        return False

    for n in order:
        if n in sources:
            if isinstance(n.value, torch.Tensor) and n.value.grad_fn is not None:
                return True
            continue
        if hist(n.args) or hist(n.kwargs):
            return True
    return False


def _snapshot(cands):
    import weakref

    snap = []
    for p in cands:
        g = p.grad
        snap.append((weakref.ref(g), g._version) if g is not None else None)
    return snap


def _unchanged(cands, snap, subset):
    """Those of `subset` whose .grad the failed backward did not touch."""
    keep = {id(p) for p in subset}
    out = []
    for p, s in zip(cands, snap):
        if id(p) not in keep:
            continue
        g = p.grad
        if s is None:
            changed = g is not None
        else:
            ref, version = s
            changed = ref() is not g or g is None or g._version != version
        if not changed:
            out.append(p)
    return out


# ---------------------------------------------------------------------------
# The chunk loop


def _balanced(remaining, c):
    n = -(-remaining // c)
    return -(-remaining // n)


def _oom(e_text, size, what):
    err = OutOfMemoryError(
        f"memfit.lazy: {what} does not fit even {size} sample(s) at a time: {e_text}"
    )
    return err


def _drive(B, limit, attempt, commit, info, cands=None, can_split=True, what="the step"):
    """Run samples [0, B) in chunks of at most `limit`, halving on OOM.

    attempt(start, size, only) -> result; only is None (all gradients) or the
    list of tensors whose gradients are still owed for these samples.
    commit(start, size, result) keeps a completed chunk's values."""
    pending = collections.deque()
    pos = 0
    c = B if limit is None else max(1, min(limit, B))
    while pending or pos < B:
        if pending:
            start, size, only = pending.popleft()
        else:
            size = _balanced(B - pos, c)
            start, only = pos, None
            pos += size
        snap = _snapshot(cands) if cands is not None else None
        failed = None
        try:
            result = attempt(start, size, only)
        except OutOfMemoryError as e:
            # Drop every reference the failed chunk held: the frames in the
            # traceback keep its tensors alive until cleared.
            failed = str(e).splitlines()[0] if str(e) else "out of memory"
            traceback.clear_frames(e.__traceback__)
            e.__traceback__ = None
        if failed is None:
            commit(start, size, result)
            result = None
            info.chunks.append((start, size))
            continue
        info.ooms += 1
        if size <= 1 or not can_split:
            raise _oom(failed, size, what)
        if snap is not None:
            owed = _unchanged(cands, snap, only if only is not None else cands)
        else:
            owed = only
        half = size // 2
        pending.appendleft((start + half, size - half, owed))
        pending.appendleft((start, half, owed))
        c = max(1, min(c, half))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return c


# ---------------------------------------------------------------------------
# backward()


def backward(T, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """LazyTensor.backward: see memfit.lazy."""
    if create_graph:
        raise LazyError(
            "memfit.lazy: backward(create_graph=True) (higher-order gradients) is not "
            "supported on lazy tensors: use memfit.eager(t) and torch.autograd"
        )
    if isinstance(inputs, torch.Tensor):
        inputs = [inputs]
    from .lazy_graph import LazyTensor

    if inputs is not None:
        inputs = [i._node.value if isinstance(i, LazyTensor) else i for i in inputs]
    if isinstance(gradient, LazyTensor):
        gradient = read(gradient._node)
    if T.state == "eager":
        info = LazyRun("backward", T.B)
        info.whole = "computed when recorded (one sample, or no batch dimension)"
        info.chunks = [(0, T.B)] if T.B else []
        _set_last(info)
        T.value.backward(gradient, retain_graph, create_graph, inputs)
        return
    if not T.requires_grad:
        raise RuntimeError(
            "element 0 of tensors does not require grad and does not have a grad_fn"
        )
    if gradient is None and T.shape is not None and math.prod(
            s for s in T.shape if s is not None) != 1:
        raise RuntimeError("grad can be implicitly created only for scalar outputs")
    info = LazyRun("backward", T.B)
    try:
        _backward(T, gradient, retain_graph, inputs, info)
    finally:
        _set_last(info)  # internal reads (targets, masks) must not hide it


def _backward(T, gradient, retain_graph, inputs, info):
    B = T.B
    if T.state == "batched":
        _backward_batched(T, gradient, inputs, info)
        return
    plan = _analyze(T, train=True)
    if plan.problem and not plan.mixes:
        if not T.allow:
            raise _unsupported(plan, f"the loss {T.name}")
        plan.mixes = plan.problem
    order, sources, counts = _collect([T], train=True)
    retain = bool(retain_graph) or _retain_needed(order, sources)
    device = T.device
    held = [n for n in order if n not in sources and n is not T and n.held()
            and n.state == "batched" and n.single_bdim() is not None]
    avail = _available(device)
    held_bytes = sum(_nbytes(h) for h in held)
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
    corder, csources, ccounts = _collect(grad_roots + targets, train=True)
    held = [h for h in held if h in ccounts or h in grad_roots]
    keep = set(grad_roots) | set(targets) | set(held)
    cands = None
    limit = entry = None
    if avail is not None and grad_roots:
        cands = _grad_candidates(corder, csources, inputs)
        sig = _signature(corder, csources, "train",
                         (tuple(sorted(r.rkind or "" for r in grad_roots)), len(held)))

        def measure(p):
            vals = _execute(corder, csources, ccounts, keep, 0, p, B, True)
            terms = [_term(vals[r], None, None) for r in grad_roots]
            vals = None
            loss = terms[0] if len(terms) == 1 else sum(terms)
            terms = None
            req = [t for t in cands if t.requires_grad]
            if req and loss.requires_grad:
                return torch.autograd.grad(loss, req, allow_unused=True, retain_graph=retain)
            return None

        per_sample = sum(_nbytes(h) for h in held) / B
        limit, entry = _limit(info, B, device, sig, measure, per_sample,
                              _new_grad_bytes(cands))
    info.chunk_limit = limit

    # Constant roots (no gradient: a mask count, a target count), chunk
    # weights, and d loss / d root.
    const_vals = {r: read(r) for r in plan.const_roots}
    weights = _prepare_weights(grad_roots)
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
        vals = _execute(corder, csources, ccounts, keep, start, size, B, True)
        terms, rvals = [], []
        for r in grad_roots:
            w = _weight(weights[r], vals, start, size, B)
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
    final = _drive(B, limit, attempt, commit, info, cands=cands, what=f"the loss {T.name}")
    _learn(entry, info, limit, final)
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
        T.value = _eval_tail(plan, values, grad=False)
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


def _eval_tail(plan, values, grad):
    """Evaluate tail nodes with root values given; returns the target's value."""
    env = dict(values)
    ctx = _ChunkCtx(env, 0, plan.B)
    with torch.set_grad_enabled(grad):
        for n in plan.tail:
            if n in env:
                continue
            for p in n.parents:
                if p not in env and (p.state == "eager" or p.value is not None):
                    env[p] = p.value
            if n.kind == "item":
                env[n] = _pluck(env[n.parent], n.path)
            else:
                env[n] = n.fn(*subst(n.args, ctx), **subst(n.kwargs, ctx))
    v = env[plan.target]
    return v.detach() if not grad else v


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
    L = _eval_tail(plan, values, grad=True)
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
    vals = _execute(order, sources, counts, keep, 0, B, B, True)
    Tv = vals.pop(T)
    for h in held:
        h.value = vals[h].detach()
    vals = None
    info.chunks.append((0, B))
    torch.autograd.backward(Tv, gradient, inputs=inputs, retain_graph=retain)
    T.value = Tv.detach()


def _backward_batched(T, gradient, inputs, info):
    """out.backward(gradient) for a batched out: chunks of out with the
    matching slices of gradient; no weighting needed."""
    order, sources, counts = _collect([T], train=True)
    mixes = next((n.mixes for n in order if n.mixes and n not in sources), None)
    retain = _retain_needed(order, sources)
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
    if _available(T.device) is not None:
        cands = _grad_candidates(order, sources, inputs)
        sig = _signature(order, sources, "train-out", None)

        def measure(p):
            v = _execute(order, sources, counts, keep, 0, p, B, True)[T]
            req = [t for t in cands if t.requires_grad]
            if req:
                return torch.autograd.grad(v, req, gradient.narrow(d, 0, k * p),
                                           allow_unused=True, retain_graph=retain)
            return None

        limit, entry = _limit(info, B, T.device, sig, measure, 0, _new_grad_bytes(cands))
    else:
        entry = None
    info.chunk_limit = limit

    def attempt(start, size, only):
        v = _execute(order, sources, counts, keep, start, size, B, True)[T]
        g = gradient if size == B else gradient.narrow(d, k * start, k * size)
        targets = only if only is not None else inputs
        if targets is None or len(targets) > 0:
            torch.autograd.backward(v, g, inputs=targets, retain_graph=retain)
        return None

    final = _drive(B, limit, attempt, lambda s, n, r: None, info, cands=cands,
                   what=f"the backward of {T.name}")
    _learn(entry, info, limit, final)


# ---------------------------------------------------------------------------
# Reading values


def read(node, grad=False):
    """The full value of a lazy node (cached): see memfit.lazy."""
    if node.state == "eager":
        return node.value
    if node.value is not None and not (grad and node.requires_grad):
        return node.value
    B = node.B
    whole_grad = grad and node.requires_grad and torch.is_grad_enabled()
    info = LazyRun("eager" if whole_grad else "read", B)
    try:
        return _read_top(node, whole_grad, info)
    finally:
        _set_last(info)


def _read_top(node, whole_grad, info):
    B = node.B
    if whole_grad:
        # A value to backpropagate through by hand: exactly eager, whole.
        info.whole = "a result that needs gradients runs whole"
        order, sources, counts = _collect([node], train=True)
        v = _execute(order, sources, counts, {node}, 0, B, B, True)[node]
        info.chunks.append((0, B))
        node.value = v.detach()
        return v
    with torch.no_grad():
        v = _read(node, info)
    node.value = v
    return v


def _read(T, info, overrides=None):
    B = T.B
    order, sources, counts = _collect([T], False, overrides)
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
        plan = _analyze(T, train=False, overrides=overrides)
        if plan.problem is None and plan.roots:
            return _read_reduced(T, plan, info, overrides)
        return _read_frontier(T, plan, info, overrides)
    # struct or constant
    return _read_whole(T, order, sources, counts, B, info, overrides)


def _read_whole(T, order, sources, counts, B, info, overrides):
    def attempt(start, size, only):
        return _execute(order, sources, counts, {T}, 0, B, B, False, overrides)[T]

    box = []
    _drive(B, B, attempt, lambda s, n, r: box.append(r), info, can_split=False,
           what=f"{T.name}")
    return box[0]


def _read_limit(info, order, sources, counts, keep, B, device, out_per_sample, overrides):
    avail = _available(device)
    if avail is None:
        return None
    sig = _signature(order, sources, "read", (len(keep), out_per_sample)) \
        if overrides is None else None

    def measure(p):
        _execute(order, sources, counts, keep, 0, p, B, False, overrides)
        return None

    limit, entry = _limit(info, B, device, sig, measure, out_per_sample)
    return limit


def _read_batched(T, bd, order, sources, counts, B, info, overrides):
    d, k = bd
    per_sample = _nbytes(T) / B
    limit = _read_limit(info, order, sources, counts, {T}, B, T.device, per_sample, overrides)
    info.chunk_limit = limit
    parts = []
    # In chunks, the result is allocated first and each chunk copied in:
    # no concatenation at the end, which would need the result twice.
    out = torch.empty(T.shape, dtype=T.dtype, device=T.device) \
        if limit is not None and limit < B else None

    def attempt(start, size, only):
        v = _execute(order, sources, counts, {T}, start, size, B, False, overrides)[T]
        if out is None:
            return v
        out.narrow(d, k * start, k * size).copy_(v)
        return None

    _drive(B, limit, attempt, lambda s, n, r: parts.append(r), info, what=f"{T.name}")
    if out is not None:
        return out
    return parts[0] if len(parts) == 1 else torch.cat(parts, d)


def _read_reduced(T, plan, info, overrides):
    B = T.B
    weights = _prepare_weights(plan.roots)
    targets = _weight_targets(weights)
    order, sources, counts = _collect(plan.roots + targets, False, overrides)
    keep = set(plan.roots) | set(targets)
    limit = _read_limit(info, order, sources, counts, keep, B, T.device, 0, overrides)
    info.chunk_limit = limit
    acc = {}

    def attempt(start, size, only):
        vals = _execute(order, sources, counts, keep, start, size, B, False, overrides)
        out = []
        for r in plan.roots:
            w = _weight(weights[r], vals, start, size, B)
            v = vals[r] if w is None else vals[r] * w
            out.append(v if r not in acc else acc[r] + v)
        return out

    def commit(start, size, result):
        for r, v in zip(plan.roots, result):
            acc[r] = v

    _drive(B, limit, attempt, commit, info, what=f"{T.name}")
    for r in plan.roots:
        if r.held() and r.value is None:
            r.value = acc[r]
    if T in acc:
        return acc[T]
    return _eval_tail(plan, acc, grad=False)


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
    order, sources, counts = _collect([T], False, over)
    return _read_whole(T, order, sources, counts, B, info, over)
