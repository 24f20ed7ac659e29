"""What one rank needs under data parallelism (DDP, ZeRO-1/2/3, FSDP, and
torch's FSDP2 fully_shard), predicted from a single-process profile. The
rules are in Note [One rank's memory under data parallelism] and Note [One
rank's memory under FSDP2] (src/core/model/data_parallel.cpp)."""

import torch

from .._native import native as _memfit
from .._step.arguments import flag

__all__: list = []

SHARDINGS = ("ddp", "zero1", "zero2", "zero3")
FSDP2 = "fsdp2"


def trainable_sizes(model):
    """Bytes of each trainable parameter: DDP's buckets hold their sum."""
    return [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]


def largest_unit_bytes(model):
    """The most parameter bytes one module holds itself (its children not
    counted): the layer an FSDP wrap per layer gathers at once."""
    return max(
        (
            sum(p.numel() * p.element_size() for p in m.parameters(recurse=False))
            for m in model.modules()
        ),
        default=0,
    )


def unit_bytes(unit):
    """Bytes of an FSDP unit given as a module, or as bytes."""
    if isinstance(unit, torch.nn.Module):
        return sum(p.numel() * p.element_size() for p in unit.parameters())
    if isinstance(unit, int) and unit >= 0:
        return unit
    raise ValueError(
        f"[data_parallel] largest_unit must be a module (the largest one FSDP "
        f"wraps) or a byte count >= 0, got {unit!r}"
    )


def optimizer_shard_fraction(optimizer_shards, sizes, world_size):
    """The fullest rank's share of the optimizer state: 0 (meaning 1/W) for
    flat even shards, the greedy whole-parameter partition for torch's
    ZeroRedundancyOptimizer."""
    if optimizer_shards == "flat":
        return 0.0
    if optimizer_shards == "parameters":
        # Adam's step is one scalar per parameter, 2 state bytes per
        # parameter byte: 8 covers it (and SGD momentum's none).
        return _memfit.largest_partition_fraction(sizes, world_size, per_parameter_bytes=8)
    raise ValueError(
        f"[data_parallel] optimizer_shards must be 'flat' (DeepSpeed, FSDP: even "
        f"shards) or 'parameters' (torch's ZeroRedundancyOptimizer: whole "
        f"parameters per rank), got {optimizer_shards!r}"
    )


# The core counts ranks in an int.
_MAX_RANKS = 2**31 - 1


def check_world_size(world_size, who):
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"[{who}] world_size must be an int >= 1 (ranks), got {world_size!r}")
    if world_size > _MAX_RANKS:
        raise ValueError(f"[{who}] world_size {world_size} is more ranks than memfit plans for "
                         f"(at most 2**31 - 1): pass the number of processes you launch")


def chain_blocks(model):
    """The modules fully_shard wraps by default: the children of the
    ModuleList or Sequential (the model itself included) with the most
    children that hold parameters; none if the model has no such chain."""
    best = []
    for m in model.modules():
        if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)):
            blocks = [c for c in m.children() if any(True for _ in c.parameters())]
            if len(blocks) > len(best):
                best = blocks
    return best if len(best) >= 2 else []


def _low_dtype(mixed_precision, name):
    if mixed_precision is None:
        return None
    if isinstance(mixed_precision, torch.dtype):
        return _floating(mixed_precision) if name == "param_dtype" else None
    if hasattr(mixed_precision, "param_dtype"):  # MixedPrecisionPolicy
        return _floating(getattr(mixed_precision, name))
    raise ValueError(
        f"[data_parallel] mixed_precision must be None, a dtype (the param_dtype) or "
        f"torch.distributed.fsdp.MixedPrecisionPolicy, got {mixed_precision!r}")


def _floating(dtype):
    """A dtype parameters or gradients can be cast to (None: not cast)."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(
            f"[data_parallel] mixed_precision's dtypes must be floating point (torch.bfloat16, "
            f"torch.float16, torch.float32), got {dtype!r}: weights cannot train in it")
    return dtype


def _cpu_offload(cpu_offload):
    """True/False, or a CPUOffloadPolicy (True) / OffloadPolicy (False)."""
    if isinstance(cpu_offload, bool):
        return cpu_offload
    kind = type(cpu_offload).__name__
    if kind in ("CPUOffloadPolicy", "OffloadPolicy"):
        return kind == "CPUOffloadPolicy"
    raise ValueError(f"[data_parallel] cpu_offload must be True, False or a "
                     f"CPUOffloadPolicy, got {cpu_offload!r}")


def _dtype_size(dtype):
    """Bytes per element of `dtype`; 0 for None (the core's "none")."""
    return 0 if dtype is None else torch.tensor([], dtype=dtype).element_size()


def _shapes(params, param_dtype):
    """What the core's fsdp2_unit needs of each parameter (the sizes are
    its arithmetic: see fsdp2_unit in memfit/core/model/data_parallel.h)."""
    return [
        _memfit.ParamShape(p.shape[0] if p.dim() > 0 else 1, p.numel(), p.element_size(),
                           param_dtype is not None and param_dtype != p.dtype)
        for p in params
    ]


def fsdp2_setup(model, world_size, units=None, mixed_precision=None, cpu_offload=False):
    """The Fsdp2Setup of `model` under fully_shard on `world_size` ranks:
    `units` (the modules fully_shard wraps, default chain_blocks(model)) and
    the root, `model`, owning every parameter no unit holds."""
    check_world_size(world_size, "data_parallel")
    cpu_offload = _cpu_offload(cpu_offload)
    if model is None or not isinstance(model, torch.nn.Module):
        raise ValueError(
            f"[data_parallel] sharding='fsdp2' needs model= (the module fully_shard wraps "
            f"last, the root), got {model!r}")
    units = chain_blocks(model) if units is None else list(units)
    names = {id(m): n for n, m in model.named_modules()}
    for u in units:
        if not isinstance(u, torch.nn.Module) or id(u) not in names or u is model:
            raise ValueError(
                f"[data_parallel] units must be submodules of the model (the ones "
                f"fully_shard wraps before the root), got {type(u).__name__}")
    owned = set()
    out = []
    # Innermost first: a unit owns what no unit inside it owns.
    for u in sorted(units, key=lambda m: -names[id(m)].count(".")):
        params = [p for p in u.parameters() if id(p) not in owned]
        owned.update(id(p) for p in params)
        out.append((names[id(u)], params))
    rest = [p for p in model.parameters() if id(p) not in owned]
    by_order = {n: i for i, n in enumerate(names.values())}
    out.sort(key=lambda up: by_order[up[0]])
    param_dtype = _low_dtype(mixed_precision, "param_dtype")
    sizes = dict(param_dtype_size=_dtype_size(param_dtype),
                 reduce_dtype_size=_dtype_size(_low_dtype(mixed_precision, "reduce_dtype")))
    made = [
        _memfit.fsdp2_unit(n, _shapes(ps, param_dtype), world_size,
                           cpu_offload=cpu_offload, **sizes)
        for n, ps in [("", rest)] + out
    ]
    scale = _memfit.fsdp2_grad_scale(_shapes(model.parameters(), param_dtype),
                                     sizes["param_dtype_size"])
    return _memfit.Fsdp2Setup(world_size, made, scale, cpu_offload)


def _check_profiled(model, sizes):
    """Raises ValueError unless `model`'s trainable parameters are those of
    the profiled step (`sizes`, trainable_sizes of the profiled model): the
    plan shards that model's parameters around that step's timeline."""
    if not isinstance(model, torch.nn.Module):
        return  # fsdp2_setup says what model= must be
    mine = trainable_sizes(model)
    if mine != list(sizes):
        fmt = _memfit.format_bytes
        raise ValueError(
            f"[data_parallel] model= is not the model this report profiled: its trainable "
            f"parameters are {len(mine)} tensors, {fmt(sum(mine))}; the profiled step's are "
            f"{len(sizes)}, {fmt(sum(sizes))}: pass the model given to memfit.profile()")


def rank_peaks(native, timeline, trainable_sizes, largest_unit_bytes, world_size,
               gradient_as_bucket_view=False, bucket_cap_mb=25, largest_unit=None,
               optimizer_shards="flat", sharding=None, model=None, units=None,
               mixed_precision=None, cpu_offload=False):
    """Report.data_parallel's work: sets the native report's per-rank peaks
    from its timeline and returns them: the four ZeRO rows, or with
    `sharding` only that one. sharding="fsdp2" plans torch's fully_shard
    (Note [One rank's memory under FSDP2]) and needs `model` (the root);
    `units` are the modules fully_shard wraps first (default: the blocks of
    the model's chain, chain_blocks()); `mixed_precision` a
    MixedPrecisionPolicy or a param dtype; `cpu_offload` True (or a
    CPUOffloadPolicy) puts the sharded state on the host: the row's
    peak_bytes is then the device's and host_bytes the host's."""
    check_world_size(world_size, "data_parallel")
    if sharding is not None and sharding not in SHARDINGS + (FSDP2,):
        raise ValueError(f"[data_parallel] unknown sharding {sharding!r}: use one of "
                         f"{', '.join(SHARDINGS + (FSDP2,))}, or None for the four ZeRO rows")
    gradient_as_bucket_view = flag(gradient_as_bucket_view, "data_parallel",
                                   "gradient_as_bucket_view")
    if (isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float))
            or not 0 < bucket_cap_mb < 2**40):
        raise ValueError(f"[data_parallel] bucket_cap_mb must be a number of MiB > 0, got "
                         f"{bucket_cap_mb!r}")
    unit = largest_unit_bytes if largest_unit is None else unit_bytes(largest_unit)
    share = optimizer_shard_fraction(optimizer_shards, list(trainable_sizes), world_size)
    # See Note [A rank's optimizer step deals parameters in another order].
    reorder = (_memfit.step_reorder_bytes(list(trainable_sizes), world_size)
               if optimizer_shards == "parameters" else 0)
    setup = None
    if sharding == FSDP2:
        _check_profiled(model, trainable_sizes)
        setup = fsdp2_setup(model, world_size, units, mixed_precision, cpu_offload)
    native.set_data_parallel(
        timeline, world_size, sum(trainable_sizes), gradient_as_bucket_view,
        int(bucket_cap_mb * 1024 * 1024), unit, share, reorder)
    if setup is not None:
        return [native.add_fsdp2(timeline, setup)]
    rows = list(native.data_parallel)
    return rows if sharding is None else [r for r in rows if r.sharding == sharding]
