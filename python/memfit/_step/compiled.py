"""Compiled models (torch.compile): which of a model's modules run compiled,
how memfit watches them without changing what is compiled, and what
compiling cost, counted apart from the step it compiled.

See Note [Recording a compiled step] for how the recording uses these.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
import weakref

import torch

from .._native import native as _memfit

__all__: list = []

# Note [Recording a compiled step]
# A compiled model's first calls compile: dynamo traces the Python, AOTAutograd
# the joint graph, inductor writes and builds kernels. What that allocates
# (fake tensors on the meta device, constants, the compiler's own Python
# objects) and how long it takes are the compiler's, not the step's: a
# profile that recorded them reported 20x the warm step. So memfit records a
# compiled step warm:
# - the first time memfit records a model, one forward and loss run first,
#   outside the recording, under CompileWatch, which counts what compiling
#   cost (time, host memory, graphs, breaks, recompiles). AOTAutograd is
#   told to compile each backward with its forward (the same graphs; by
#   default it compiles a backward at its first call), so the warm-up's
#   backward need not run; a torch without that switch runs the backward
#   too. The optimizer's step is left out: its state must be made inside
#   the recording;
# - a recording during which anything compiled (a new batch shape, an
#   optimizer step compiled by the user) is thrown away and made again,
#   warm: the compiled graph it ran is the one the next step runs;
# - module hooks are put only where they run outside compiled code (see
#   module_calls): a hook inside a compiled region is traced by dynamo
#   (a graph break at every Python call into the recorder) and adding one
#   after compiling fails the hooks' guard (a recompile), so the recorded
#   graph would not be the user's. Allocations inside a compiled region are
#   attributed to the compiled module, not to its submodules (inductor fuses
#   across them anyway).
# Batches other than the first (prediction's probes, find_batch_size's
# search) are new shapes: dynamo's automatic dynamic shapes compiles the
# batch dimension dynamic at the first of them, once, and later probes run
# that graph. A recording that compiled is said in its CompileCost
# (recompiles and their reasons): the verification at find_batch_size's
# answer says so when its graph is not the probes'.


@dataclasses.dataclass
class GraphBreak:
    """Where dynamo split a compiled region (the line the next graph resumes
    at: the line that broke it), and why; seconds: compiling the graph
    after it."""

    file: str
    line: int
    function: str
    reason: str  # dynamo's reason, first line
    seconds: float = 0.0

    @property
    def where(self) -> str:
        return f"{_short(self.file)}:{self.line} ({self.function})"

    def __str__(self):
        return f"{self.where}: {self.reason}"


@dataclasses.dataclass
class CompileCost:
    """What compiling cost, counted apart from the step: never in its bytes.

    seconds: compile time (dynamo, AOTAutograd and the backend, forward and
    backward), as torch's compilation metrics count it; host_peak_bytes:
    how far this process's resident memory rose above where it started
    while compiling (the warm-up step's own tensors included on a CPU;
    None where the OS cannot say); graphs: graphs compiled; graph_breaks:
    where regions were split; recompiles: dynamo's reason for each frame
    compiled again (a guard failed: a new shape, a changed attribute);
    frames: frames compiled (0: nothing compiled); ran_eager: why the
    step was recorded eager instead (inductor cannot build kernels here,
    the meta device), else None; recorded_warm: False when the step
    compiled again at every call, so its recording includes compiling."""

    seconds: float = 0.0
    host_peak_bytes: int | None = None
    graphs: int = 0
    graph_breaks: list = dataclasses.field(default_factory=list)
    recompiles: list = dataclasses.field(default_factory=list)
    frames: int = 0
    ran_eager: str | None = None
    recorded_warm: bool = True

    @property
    def compiled(self) -> bool:
        """Whether anything was compiled."""
        return self.frames > 0 or self.seconds > 0

    def __add__(self, other: CompileCost) -> CompileCost:
        peaks = [p for p in (self.host_peak_bytes, other.host_peak_bytes) if p is not None]
        return CompileCost(
            self.seconds + other.seconds, max(peaks) if peaks else None,
            self.graphs + other.graphs, self.graph_breaks + other.graph_breaks,
            self.recompiles + other.recompiles, self.frames + other.frames,
            self.ran_eager or other.ran_eager, self.recorded_warm and other.recorded_warm)

    def line(self) -> str:
        """One line: what compiling cost."""
        if self.ran_eager:
            return self.ran_eager
        if not self.compiled:
            return "compiled: nothing compiled here (warm already)"
        host = ("" if self.host_peak_bytes is None
                else f", host memory +{_memfit.format_bytes(self.host_peak_bytes)} at its peak")
        breaks = len(self.graph_breaks)
        text = (f"compiling took {self.seconds:.1f} s{host}, {self.graphs} graph"
                f"{'' if self.graphs == 1 else 's'}, {breaks} graph break"
                f"{'' if breaks == 1 else 's'}")
        if self.graph_breaks:
            text += f" (first: {self.graph_breaks[0]})"
        if self.recompiles:
            text += (f", {len(self.recompiles)} recompile{'' if len(self.recompiles) == 1 else 's'}"
                     f" ({self.recompiles[0]})")
        else:
            text += ", no recompile"
        return text

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["graph_breaks"] = [dataclasses.asdict(b) for b in self.graph_breaks]
        return d


def _optimized_module():
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except ImportError:  # a torch without dynamo
        return None
    return OptimizedModule


def _compiled_in_place(module):
    """model.compile(): nn.Module.__call__ runs _compiled_call_impl, a
    compiled _call_impl (the module's own hooks included)."""
    return getattr(module, "_compiled_call_impl", None) is not None


def _compiled_forward(module):
    """model.forward = torch.compile(model.forward): hooks run outside."""
    fwd = module.__dict__.get("forward")
    return fwd is not None and hasattr(fwd, "_torchdynamo_orig_callable")


def compiled_paths(model) -> list[str]:
    """Paths of the modules of `model` that run compiled: torch.compile(m)
    wrappers, modules compiled in place (m.compile()) and modules whose
    forward was replaced by a compiled function ("" is the model)."""
    if not isinstance(model, torch.nn.Module):
        return []
    wrapper = _optimized_module()
    return [path for path, m in model.named_modules()
            if (wrapper is not None and isinstance(m, wrapper)) or _compiled_in_place(m)
            or _compiled_forward(m)]


def is_compiled(model) -> bool:
    """Whether any module of `model` runs compiled."""
    return bool(compiled_paths(model))


def module_calls(model):
    """(path, module, how) for each module of `model` whose call memfit can
    watch without entering compiled code: how is "hooks" (forward hooks run
    outside compiled code) or "wrap" (a module compiled in place: its hooks
    would run inside, so its compiled call is wrapped). Modules inside a
    compiled region are left out. See Note [Recording a compiled step]."""
    wrapper = _optimized_module()
    inside = set()
    out = []
    for path, m in model.named_modules():
        if id(m) in inside:
            continue
        if wrapper is not None and isinstance(m, wrapper):
            inside.update(id(s) for s in m._orig_mod.modules())
            out.append((path, m, "hooks"))
        elif _compiled_in_place(m):
            inside.update(id(s) for s in m.modules())
            out.append((path, m, "wrap"))
        elif _compiled_forward(m):
            inside.update(id(s) for s in m.modules() if s is not m)
            out.append((path, m, "hooks"))
        else:
            out.append((path, m, "hooks"))
    return out


def compiled_roots(model):
    """The (path, module, how) of module_calls that run compiled: whose call
    enters compiled code."""
    wrapper = _optimized_module()
    return [(path, m, how) for path, m, how in module_calls(model)
            if (wrapper is not None and isinstance(m, wrapper)) or _compiled_in_place(m)
            or _compiled_forward(m)]


_calls = itertools.count()


def fresh_call(fn):
    """A function calling `fn` whose code object is its own: torch.compile
    keeps the cache entries of what memfit compiles (a capture, a memory
    budget) there, not on the model's forward, where every entry counts
    against the recompile_limit of the user's own compiles."""
    def call(*args, **kwargs):
        return fn(*args, **kwargs)

    call.__code__ = call.__code__.replace(co_name=f"memfit_call_{next(_calls)}")
    return call


def uncompiled_call(module):
    """`module`'s call without the compiled wrapper around it: what a
    compile of memfit's own traces (torch.compile's original module; a
    module compiled in place, its plain _call_impl)."""
    wrapper = _optimized_module()
    if wrapper is not None and isinstance(module, wrapper):
        return module._orig_mod.__call__
    if _compiled_in_place(module):
        return module._call_impl
    return module.__call__


class _Wrapped:
    """A handle like a hook's: remove() puts the compiled call back."""

    def __init__(self, module, pre, post):
        self.module = module
        self.original = module._compiled_call_impl

        def call(*args, **kwargs):
            pre(module, args)
            out = self.original(*args, **kwargs)
            post(module, args, out)
            return out

        module._compiled_call_impl = call

    def remove(self):
        if self.module is not None:
            self.module._compiled_call_impl = self.original
            self.module = None


def watch_call(module, how, pre, post):
    """Handles (each with remove()) that call pre(module, args) before and
    post(module, args, output) after each call of `module`, by `how` (see
    module_calls)."""
    if how == "wrap":
        return [_Wrapped(module, pre, post)]
    return [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]



@contextlib.contextmanager
def eager_stance():
    """Compiled code runs eagerly, compiling nothing, inside the block (the
    meta recording of a compiled model, compare_eager's eager step)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    if set_stance is not None:
        with set_stance("force_eager"):
            yield
        return
    with torch._dynamo.config.patch(disable=True):
        yield


def compiler_unavailable(model) -> str | None:
    """The line saying inductor cannot build its CPU kernels here (no working
    C++ compiler), or None. Only asked for a model whose compiled parts run
    inductor on the CPU."""
    if not _runs_inductor_on_cpu(model):
        return None
    try:
        from torch._inductor import cpp_builder
        cpp_builder.get_cpp_compiler()
    except ImportError:
        return None
    except Exception as e:  # InvalidCxxCompiler and what a broken toolchain raises
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return (f"torch.compile's inductor cannot build CPU kernels here ({first}): recorded "
                f"the eager step instead; compiled may differ (install g++ or set CXX)")
    return None


def _backend_of(compiled):
    """The backend given to torch.compile (an object, e.g. inductor's
    wrapper, or the user's callable), from a torch.compile wrapper or a
    compiled function; None when torch does not say."""
    ctx = getattr(compiled, "dynamo_ctx", None)
    callback = getattr(ctx, "callback", None)
    if callback is None and callable(compiled):  # a compiled function: in its closure
        for cell in getattr(compiled, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if hasattr(value, "_torchdynamo_orig_backend"):
                callback = value
                break
    backend = callback
    while hasattr(backend, "_torchdynamo_orig_backend"):  # dynamo's wrappers around it
        backend = backend._torchdynamo_orig_backend
    return backend


def _runs_inductor_on_cpu(model):
    """Whether a compiled part of `model` compiles with inductor on the CPU."""
    if any(p.device.type != "cpu" for p in model.parameters()):
        return False
    wrapper = _optimized_module()
    for _, m in model.named_modules():
        if wrapper is not None and isinstance(m, wrapper):
            backend = _backend_of(m)
        elif _compiled_in_place(m):
            backend = _backend_of(m._compiled_call_impl)
        elif _compiled_forward(m):
            backend = _backend_of(m.__dict__["forward"])
        else:
            continue
        if backend is None or getattr(backend, "compiler_name", backend) == "inductor":
            return True
    return False


def _compilation_metrics():
    try:
        from torch._dynamo.utils import get_compilation_metrics
    except ImportError:
        return []
    return get_compilation_metrics()


def _graph_break_counts():
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return {}
    return dict(counters["graph_break"])


def _first_line(text):
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()
    return str(text)


def _guard_reason(text):
    """dynamo's "0/1: tensor 'x' size mismatch ...  # source" as "tensor 'x'
    size mismatch ...": the frame's compile id and the quoted source go."""
    line = _first_line(text)
    head, sep, rest = line.partition(": ")
    if sep and "/" in head and head.replace("/", "").isdigit():
        line = rest
    return line.split("  #")[0].strip()[:200]


def _short(path):
    return "/".join(path.replace("\\", "/").split("/")[-2:])


_RESUME = "torch_dynamo_resume_in_"


def graph_break_of(metrics, reasons=()):
    """The GraphBreak a compiled frame's metrics record, when the frame is
    dynamo's resumption after a break (its code starts at the line that
    broke the graph); else None."""
    name = getattr(metrics, "co_name", None) or ""
    if not name.startswith(_RESUME):
        return None
    parent = name[len(_RESUME):].rsplit("_at_", 1)[0]
    why = (list(reasons) or ["(dynamo gave no reason)"])[0]
    return GraphBreak(getattr(metrics, "co_filename", "?"), metrics.co_firstlineno, parent,
                      why, getattr(metrics, "entire_frame_compile_time_s", None) or 0.0)


def compilation_metrics() -> list:
    """torch's record of each compile (the last 64): frames, breaks,
    recompiles, times."""
    return _compilation_metrics()


class _HostHighWater:
    """This process's resident memory: where it started, and its peak since
    (Linux: /proc/self/status's VmHWM, reset through clear_refs)."""

    def __init__(self):
        self.start = _status_bytes("VmRSS")
        self.reset = False
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current resident size
            self.reset = True
        except OSError:
            pass

    def rise(self):
        if not self.reset or self.start is None:
            return None
        peak = _status_bytes("VmHWM")
        return None if peak is None else max(0, peak - self.start)


def _status_bytes(key):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class CompileWatch:
    """Inside the block, what torch.compile compiled: `cost` (a CompileCost)
    once it ends. From torch's compilation metrics (one per frame compiled
    and per backward compiled) and dynamo's graph-break counters."""

    def __enter__(self):
        self._seen = {id(m) for m in _compilation_metrics()}
        self._breaks = _graph_break_counts()
        self._host = _HostHighWater()
        self.cost = CompileCost()
        return self

    def __exit__(self, *exc):
        new = [m for m in _compilation_metrics() if id(m) not in self._seen]
        cost = CompileCost(host_peak_bytes=self._host.rise() if new else None)
        reasons = [_first_line(k) for k, v in _graph_break_counts().items()
                   if v > self._breaks.get(k, 0)]
        restarts = {}
        for m in new:
            name = getattr(m, "co_name", None)
            backward = getattr(m, "backward_cumulative_compile_time_us", None)
            if name is None:  # a backward compiled lazily, at the first backward
                cost.seconds += (backward or 0) / 1e6
                continue
            cost.frames += 1
            cost.seconds += getattr(m, "entire_frame_compile_time_s", None) or 0.0
            if getattr(m, "graph_op_count", None):
                cost.graphs += 1
            for r in getattr(m, "restart_reasons", None) or ():
                restarts.setdefault(_first_line(r), None)
            why = getattr(m, "recompile_reason", None)
            if why:
                cost.recompiles.append(_guard_reason(why))
            brk = graph_break_of(m, list(restarts) or reasons)
            if brk is not None and all(b.where != brk.where for b in cost.graph_breaks):
                cost.graph_breaks.append(brk)
        if not new:
            cost.host_peak_bytes = None
        self.cost = cost
        return False


# Models memfit has recorded warm once: a later recording of them (a probe
# at another batch) runs first and is recorded again only if it compiled.
_warmed = weakref.WeakSet()


@contextlib.contextmanager
def backward_compiled_with_forward():
    """Inside the block AOTAutograd compiles each graph's backward together
    with its forward, not at its first backward: the same graphs, compiled
    sooner. Yields whether it does (a torch without the switch: False)."""
    try:
        from torch._functorch import config
    except ImportError:
        config = None
    if config is None or not hasattr(config, "force_non_lazy_backward_lowering"):
        yield False
        return
    with config.patch(force_non_lazy_backward_lowering=True):
        yield True


def record_warm(model, record, reset, iterations=1):
    """A recording of a compiled step, warm (See Note [Recording a compiled
    step]): record(warm_up) records the step (warm_up "forward": its
    forward and loss, thrown away; "backward": its backward too); reset()
    drops what a thrown-away run left (.grad, the optimizer's state).
    Returns (the recording, the CompileCost of what compiled on the way,
    whether the kept recording ran warm).

    The warm-up runs the forward alone where AOTAutograd can compile the
    backward with it: running the backward too cost a warm backward
    beyond compiling, a third of the profile's cost.

    The compile time is the larger of torch's compilation metrics and the
    warm-up's wall time less what the phases it ran take warm (the
    recording's over its `iterations`): the metrics leave out loading the
    compiled code and building guards, which the first call pays too."""
    cost = CompileCost()
    warm_up_s = None
    if model not in _warmed:
        t0 = time.perf_counter()
        with CompileWatch() as w, backward_compiled_with_forward() as forward_only:
            warm_up = "forward" if forward_only else "backward"
            record(warm_up)
        warm_up_s = time.perf_counter() - t0
        cost += w.cost
        reset()
    rec, warm = None, False
    for attempt in range(2):
        with CompileWatch() as w:
            rec = record(None)
        if not w.cost.compiled:
            warm = True
            break
        cost += w.cost
        if attempt == 0:  # its recording holds the compile's work: recorded again
            rec = None
            reset()
    # A step that compiled twice in a row compiles at every call: the second
    # recording is kept, as it runs, and warm=False says so.
    if warm:
        _warmed.add(model)
        if warm_up_s is not None and cost.compiled:
            ran_s = rec.forward_seconds + (rec.backward_seconds if warm_up == "backward" else 0.0)
            cost.seconds = max(cost.seconds, warm_up_s - ran_s / max(1, iterations))
    return rec, cost, warm


def inductor_error(e) -> str | None:
    """The line for a compile that failed because inductor could not build
    its kernels (no C++ compiler), or None for any other error."""
    seen = e
    while seen is not None:
        name = type(seen).__name__
        if name in ("InvalidCxxCompiler", "CppCompileError"):
            return (f"torch.compile's inductor could not build CPU kernels here "
                    f"({_first_line(seen)}): recorded the eager step instead; compiled may "
                    f"differ (install g++ or set CXX)")
        seen = seen.__cause__ or seen.__context__
    return None

