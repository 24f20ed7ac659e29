"""Activation checkpointing over a chain of blocks: finding the chain,
running chosen blocks under torch.utils.checkpoint, and measuring what each
block saves and costs for the core's planner."""

import contextlib
import dataclasses
import statistics
import time

import torch
import torch.utils.checkpoint

from .. import _memfit
from ..training_step import call_model
from ..snapshot import ModelTensors


@dataclasses.dataclass
class Chain:
    """The blocks advise may checkpoint, in the order forward runs them."""

    path: str  # the container's path in the model ("" the model itself); None for a list
    block_paths: list  # each block's path in the model, for get_submodule
    found: bool  # True when advise chose it (chain= not given)

    def __len__(self):
        return len(self.block_paths)

    def describe(self):
        if self.path is None:
            return f"the {len(self)} modules given as chain="
        where = self.path or "the model itself"
        how = "found" if self.found else "given"
        return f"{where} ({len(self)} blocks, {how})"


def _paths(model):
    return {id(m): path for path, m in model.named_modules(remove_duplicate=False)}


def _join(prefix, name):
    return f"{prefix}.{name}" if prefix else name


def _has_parameters(module):
    return any(True for _ in module.parameters())


def find_chain(model):
    """The longest nn.Sequential / nn.ModuleList anywhere in `model` with at
    least two blocks holding parameters (ties: the shallowest, then the
    first); None when there is none."""
    best, best_key = None, None
    for path, m in model.named_modules():
        if not isinstance(m, (torch.nn.Sequential, torch.nn.ModuleList)):
            continue
        children = list(m.named_children())
        weighted = sum(1 for _, c in children if _has_parameters(c))
        if weighted < 2:
            continue
        key = (weighted, len(children), -path.count(".") - bool(path))
        if best_key is None or key > best_key:
            best_key = key
            best = Chain(path, [_join(path, name) for name, _ in children], True)
    return best


def resolve_chain(model, chain):
    """The Chain for advise's chain= argument: None (find one), an
    nn.Sequential / nn.ModuleList inside the model, or a list of its modules.
    Raises ValueError for modules that are not the model's."""
    if chain is None:
        return find_chain(model)
    paths = _paths(model)
    if isinstance(chain, (torch.nn.Sequential, torch.nn.ModuleList)):
        if id(chain) not in paths:
            raise ValueError(
                f"[advise] chain= is a {type(chain).__name__} that is not inside the "
                f"model: pass one of the model's own submodules (e.g. model.layers)"
            )
        path = paths[id(chain)]
        blocks = [_join(path, name) for name, _ in chain.named_children()]
        result = Chain(path, blocks, False)
    elif isinstance(chain, (list, tuple)):
        blocks = []
        for i, m in enumerate(chain):
            if not isinstance(m, torch.nn.Module):
                raise ValueError(
                    f"[advise] chain= item {i} is a {type(m).__name__}, not an nn.Module"
                )
            if id(m) not in paths:
                raise ValueError(
                    f"[advise] chain= block {i} ({type(m).__name__}) is not a module "
                    f"of the model: pass the model's own blocks"
                )
            blocks.append(paths[id(m)])
        result = Chain(None, blocks, False)
    else:
        raise ValueError(
            f"[advise] chain= must be an nn.Sequential, an nn.ModuleList or a list "
            f"of the model's modules, got {type(chain).__name__}"
        )
    if not result.block_paths:
        raise ValueError("[advise] chain= holds no blocks")
    return result


def _checkpointed_forward(forward):
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        fn = (lambda *a: forward(*a, **kwargs)) if kwargs else forward
        # Non-reentrant: gradients reach every tensor the block uses (kwargs,
        # closures), and dropout replays from the saved RNG state.
        return torch.utils.checkpoint.checkpoint(
            fn, *args, use_reentrant=False, preserve_rng_state=True
        )

    return run


@contextlib.contextmanager
def override_forward(module, wrap):
    """module.forward replaced by wrap(module.forward) inside the block."""
    had = "forward" in module.__dict__
    before = module.__dict__.get("forward")
    module.forward = wrap(module.forward)
    try:
        yield module
    finally:
        if had:
            module.forward = before
        else:
            del module.forward


@contextlib.contextmanager
def checkpointed(blocks):
    """Each of `blocks` runs its forward under torch.utils.checkpoint inside
    the block: its activations are dropped after forward and recomputed in
    backward. Gradients equal the plain step's."""
    with contextlib.ExitStack() as stack:
        for b in blocks:
            stack.enter_context(override_forward(b, _checkpointed_forward))
        yield blocks


def block_of(path, block_paths):
    """Index of the block `path` belongs to; -1 for none."""
    for i, b in enumerate(block_paths):
        if not b or path == b or path.startswith(b + "."):
            return i
    return -1


def block_activations(report, block_paths):
    """Activation bytes each block holds at the end of the first forward."""
    out = [0] * len(block_paths)
    for path, nbytes in report.modules:
        i = block_of(path, block_paths)
        if i >= 0:
            out[i] += nbytes
    return out


def block_forward_ns(model, inputs, block_paths, repeats, sync=lambda: None):
    """Median forward time of each block (ns), timed by hooks over `repeats`
    plain forwards (after one warm-up) with gradients on: the price of
    recomputing it. `sync` waits for a device's queued work."""
    blocks = [model.get_submodule(p) for p in block_paths]
    saved = ModelTensors(model)
    saved.swap_in_copies()  # forwards in training mode update buffers (BatchNorm)
    starts = [0] * len(blocks)
    times = [[] for _ in blocks]
    hooks = []
    for i, b in enumerate(blocks):

        def pre(_m, _in, i=i):
            sync()
            starts[i] = time.perf_counter_ns()

        def post(_m, _in, _out, i=i):
            sync()
            times[i].append(time.perf_counter_ns() - starts[i])

        hooks.append(b.register_forward_pre_hook(pre))
        hooks.append(b.register_forward_hook(post))
    try:
        for r in range(repeats + 1):
            if r == 1:
                for t in times:
                    t.clear()
            out = call_model(model, inputs)
            del out
    finally:
        for h in hooks:
            h.remove()
        saved.restore()
    return [float(max(1, statistics.median(t))) if t else 1.0 for t in times]


# Note [Calibrating the chain from two profiles] (src/torch/strategies.cpp)
# applies here as it does to the built-in models: a plain profile and one with
# every block checkpointed, at the same batch, fill the planner's model.
def calibrate(plain, every, block_paths, forward_ns):
    """(segments, memory) for the core planner from a plain profile and one
    with every block checkpointed."""
    kept = block_activations(plain, block_paths)
    outs = block_activations(every, block_paths)
    segments = []
    for path, k, o, ns in zip(block_paths, kept, outs, forward_ns):
        segments.append(
            _memfit.ChainSegment(name=path, activation_bytes=max(0, k - o), recompute_ns=ns)
        )
    total = sum(s.activation_bytes for s in segments)
    largest = max((s.activation_bytes for s in segments), default=0)
    fwd, bwd, other = _phase_peaks(plain)
    _, bwd_every, _ = _phase_peaks(every)
    # See Note [Calibrating the chain from two profiles] (chain_calibration.cpp).
    memory = _memfit.ChainMemory(
        forward_fixed=max(fwd, bwd) - total,
        backward_fixed=min(bwd - total, max(0, bwd_every - largest)),
        other_peak=other,
    )
    return segments, memory


def _phase_peaks(report):
    """(forward and loss, backward, other phases) peaks of a report."""
    fwd = bwd = other = 0
    for p in report.phases:
        if p["name"] in ("forward", "loss"):
            fwd = max(fwd, p["peak_bytes"])
        elif p["name"] == "backward":
            bwd = max(bwd, p["peak_bytes"])
        else:
            other = max(other, p["peak_bytes"])
    return fwd, bwd, other
