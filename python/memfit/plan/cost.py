"""What a memory-saving strategy costs in time, estimated without running:
FLOPs of the step counted on meta tensors, bytes moved over the host link.

Note [Time estimated from FLOPs and bytes]: a step on the meta device has no
timings, and a 7B model cannot run on the machine that plans it. So the
cost of each strategy is estimated from what it adds to the plain step:
recomputation adds the forward FLOPs of the blocks it recomputes (counted
with torch.utils.flop_counter's formulas on a meta run of the real model:
here by count_step_flops, in advise while the step is recorded, See Note
[FLOPs counted while a step is recorded]), host offload adds bytes over the host link (parameters and
gradients each way). Time = FLOPs / device_flops + bytes / link_bytes_per_s,
no overlap of transfers with compute (an upper bound for offload), and only
matmul-like ops have FLOPs in torch's counter (elementwise work is free
here). Every figure is labelled an estimate: relative costs between
strategies are what it is for, not wall time.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from .._step.hints import Batch, LossFn
from .._step.meta_reads import MetaReads
from .._step.callable_state import CallableState, users_step_functions
from .._step.user_state import ModelTensors, kept_rng, model_modules, private_copy
from .strategies.checkpoint import find_chain

__all__ = ["CostRow", "estimate_costs"]

# A100-class defaults: dense fp32-with-TF32 / bf16 sustained rate and a
# PCIe 4.0 x16 link. Pass your own to estimate_costs().
DEFAULT_DEVICE_FLOPS = 100e12
DEFAULT_LINK_BYTES_PER_S = 25e9


@dataclass
class StepFlops:
    """FLOPs of one training step (forward with loss, backward), counted on
    meta; `blocks`: forward FLOPs of each block of the model's chain."""

    forward: int
    backward: int
    blocks: dict = field(default_factory=dict)
    trainable_bytes: int = 0
    parameter_bytes: int = 0

    @classmethod
    def of(cls, model, forward, backward, blocks):
        """The counts of `model`'s step, with its parameters' bytes."""
        return cls(forward=forward, backward=backward, blocks=blocks,
                   trainable_bytes=sum(p.numel() * p.element_size() for p in model.parameters()
                                       if p.requires_grad),
                   parameter_bytes=sum(p.numel() * p.element_size()
                                       for p in model.parameters()))


@dataclass
class CostRow:
    """One strategy's estimated extra cost over the plain step."""

    strategy: str
    extra_flops: int
    bytes_moved: int
    relative_time: float  # estimated step time / plain step time
    basis: str  # how it was estimated


@functools.lru_cache(maxsize=None)
def _decomposes(func):
    """Whether OpOverload.decompose would run something for `func` (a
    CompositeImplicitAutograd kernel, Python or C++) rather than return
    NotImplemented: most ops have none, and trying cost a push and a pop of
    the mode for each of them."""
    key = torch._C.DispatchKey.CompositeImplicitAutograd
    return key in func.py_kernels or torch._C._dispatch_has_kernel_for_dispatch_key(
        func.name(), key)


class _OpFlops(TorchDispatchMode):
    """FLOPs of the ops in torch's flop registry (its own formulas: matmuls,
    convolutions, attention), in total and inside each block's forward.
    torch's FlopCounterMode counts the same ops with the same formulas, but
    tracks every module's forward and backward with hooks: on an 8B Llama
    it costs 8x the step it counts. An op outside the registry runs as its
    decomposition where it has one, as in FlopCounterMode; a higher-order
    op raises Unsupported and the count is made again by FlopCounterMode."""

    class Unsupported(Exception):
        pass

    def __init__(self):
        super().__init__()
        self.total = 0
        self.block = None
        self.by_block = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            raise _OpFlops.Unsupported(str(func))
        formula = flop_registry.get(func._overloadpacket)
        if formula is None and _decomposes(func):
            # As FlopCounterMode: an op it has no formula for runs as its
            # decomposition, if it has one, whose ops are counted.
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        if formula is not None:
            n = formula(*args, **kwargs, out_val=out)
            self.total += n
            if self.block is not None:
                self.by_block[self.block] = self.by_block.get(self.block, 0) + n
        return out

    @contextlib.contextmanager
    def inside(self, model, paths):
        """Counts each path's forward FLOPs under its name while it runs."""
        handles = []
        for path in paths:
            block = model.get_submodule(path)
            handles.append(block.register_forward_pre_hook(
                lambda _m, _a, path=path: setattr(self, "block", path)))
            handles.append(block.register_forward_hook(
                lambda _m, _a, _o: setattr(self, "block", None)))
        try:
            yield self
        finally:
            for h in handles:
                h.remove()


def _count_on_meta(model, inputs, target, loss_fn, fwd, bwd):
    """Runs the step on meta copies, forward and loss under the mode `fwd`,
    backward under `bwd`; the model and the inputs are left as they were."""
    from .._step.user_step import as_user_step  # the step as profile() runs it

    saved = ModelTensors(model)
    # See Note [What the user's functions keep] (callable_state.py).
    functions = CallableState(users_step_functions(loss_fn, (), model_modules(model)))
    try:
        with kept_rng(), MetaReads().answering():
            saved.swap_in_copies(torch.device("meta"))
            x = private_copy(inputs, torch.device("meta"))
            y = None if target is None else private_copy(target, torch.device("meta"))
            with fwd:
                loss = as_user_step(loss_fn).run(model, x, y)
            with bwd:
                loss.backward()
    finally:
        saved.restore()
        functions.restore()


def count_step_flops(model, inputs, target=None, loss_fn=None):
    """FLOPs of forward+loss and of backward for `model` on `inputs`, run on
    meta copies (the model, its .grad and the inputs are left as they were;
    nothing real is computed). loss_fn as in memfit.profile."""
    chain = find_chain(model)
    paths = list(chain.block_paths) if chain is not None else []
    try:
        fwd, bwd = _OpFlops(), _OpFlops()
        with fwd.inside(model, paths):
            _count_on_meta(model, inputs, target, loss_fn, fwd, bwd)
        forward, backward = fwd.total, bwd.total
        blocks = {path: fwd.by_block.get(path, 0) for path in paths}
    except _OpFlops.Unsupported:
        fwd, bwd = FlopCounterMode(display=False), FlopCounterMode(display=False)
        _count_on_meta(model, inputs, target, loss_fn, fwd, bwd)
        forward, backward = fwd.get_total_flops(), bwd.get_total_flops()
        counts, root = fwd.get_flop_counts(), type(model).__name__
        blocks = {path: sum(counts.get(f"{root}.{path}", {}).values()) for path in paths}
    return StepFlops.of(model, forward, backward, blocks)


def estimate_costs(model: torch.nn.Module, inputs: Batch, target: Batch = None,
                   loss_fn: LossFn | None = None, device_flops: float = DEFAULT_DEVICE_FLOPS,
                   link_bytes_per_s: float = DEFAULT_LINK_BYTES_PER_S,
                   flops: StepFlops | None = None) -> list[CostRow]:
    """Estimated relative step time of each strategy against the plain step
    (See Note [Time estimated from FLOPs and bytes]): recompute every block
    of the model's chain (HF gradient_checkpointing_enable()), every other
    block, optimizer state on the host (memfit.offload: gradients down,
    parameters up), parameters offloaded too (FSDP CPU offload: parameters
    up for forward and for backward, gradients down). Returns CostRows; the
    first is the plain step."""
    if not device_flops > 0 or not link_bytes_per_s > 0:
        raise ValueError(
            f"[estimate_costs] device_flops and link_bytes_per_s must be > 0, got "
            f"{device_flops!r} and {link_bytes_per_s!r}")
    f = flops if flops is not None else count_step_flops(model, inputs, target, loss_fn)
    plain = (f.forward + f.backward) / device_flops
    if plain <= 0:
        raise ValueError(
            "[estimate_costs] the step has no counted FLOPs (no matmul-like op): "
            "its time cannot be estimated from FLOPs")
    basis = (f"estimate: FLOPs at {device_flops / 1e12:g} TFLOP/s, host link "
             f"{link_bytes_per_s / 1e9:g} GB/s, no overlap")

    def row(name, extra_flops=0, moved=0):
        t = plain + extra_flops / device_flops + moved / link_bytes_per_s
        return CostRow(name, int(extra_flops), int(moved), t / plain, basis)

    rows = [row("plain step")]
    paths = list(f.blocks)
    if paths:
        rows.append(row(f"recompute every block ({len(paths)})",
                        sum(f.blocks.values())))
        rows.append(row(f"recompute every other block ({len(paths[::2])})",
                        sum(f.blocks[p] for p in paths[::2])))
    rows.append(row("optimizer state on the host", 0, 2 * f.trainable_bytes))
    rows.append(row("parameters and optimizer state on the host", 0,
                    2 * f.parameter_bytes + f.trainable_bytes))
    return rows


def cost_table(rows):
    """The rows as a Markdown table."""
    lines = ["| strategy | extra FLOPs | bytes moved per step | est. step time |",
             "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.strategy} | {r.extra_flops / 1e12:.2f} T | "
                     f"{r.bytes_moved / 2**30:.2f} GiB | {r.relative_time:.2f}x |")
    lines.append(f"({rows[0].basis})")
    return "\n".join(lines)
