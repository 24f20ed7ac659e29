"""What one rank needs under data parallelism (DDP, ZeRO-1/2/3, FSDP),
predicted from a single-process profile. The rules are in
Note [One rank's memory under data parallelism] (src/core/data_parallel.cpp)."""

import torch

from . import _memfit

SHARDINGS = ("ddp", "zero1", "zero2", "zero3")


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
        return _memfit.largest_partition_fraction(sizes, world_size)
    raise ValueError(
        f"[data_parallel] optimizer_shards must be 'flat' (DeepSpeed, FSDP: even "
        f"shards) or 'parameters' (torch's ZeroRedundancyOptimizer: whole "
        f"parameters per rank), got {optimizer_shards!r}"
    )


def check_world_size(world_size, who):
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"[{who}] world_size must be an int >= 1 (ranks), got {world_size!r}")


def rank_peaks(native, timeline, trainable_sizes, largest_unit_bytes, world_size,
               gradient_as_bucket_view=False, bucket_cap_mb=25, largest_unit=None,
               optimizer_shards="flat"):
    """Report.data_parallel's work: sets the native report's per-rank peaks
    from its timeline and returns them."""
    check_world_size(world_size, "data_parallel")
    if not bucket_cap_mb > 0:
        raise ValueError(f"[data_parallel] bucket_cap_mb must be > 0, got {bucket_cap_mb!r}")
    unit = largest_unit_bytes if largest_unit is None else unit_bytes(largest_unit)
    share = optimizer_shard_fraction(optimizer_shards, list(trainable_sizes), world_size)
    # See Note [A rank's optimizer step deals parameters in another order].
    reorder = (_memfit.step_reorder_bytes(list(trainable_sizes), world_size)
               if optimizer_shards == "parameters" else 0)
    native.set_data_parallel(
        timeline, world_size, sum(trainable_sizes), bool(gradient_as_bucket_view),
        int(bucket_cap_mb * 1024 * 1024), unit, share, reorder)
    return list(native.data_parallel)
