"""The room a training step may take, resolved once from the user's budget
for find_batch_size, the Trainer and the framework callbacks: See Note [The
budget is the whole device]."""

from __future__ import annotations

import dataclasses
import gc

import torch

from .._native import native as _memfit
from .._step.device import to_bytes
from .._step.user_state import step_bytes
from .ranks import sharded_optimizer

__all__: list = []

# Note [The budget is the whole device]
# A budget is what the device has for the user's training: the step and
# everything beside it. The rehearsal re-creates and records what the step
# starts with (the weights and buffers, the optimizer's state and the .grad
# held now: Note [State the step starts with], user_state.py), so
#     room = min(budget, capacity) - beside
# - capacity: what the device can give at all, where memfit sees the device
#   (the simulated device's budget; a card's free memory plus what torch's
#   caching allocator holds): the CUDA context and other processes are taken.
# - beside: what the device holds that the step does not re-create (the
#   user's other tensors: an EMA copy, a teacher model, the batch they hold):
#   the simulated device's tracked bytes, or the card's allocated bytes, less
#   the step's own.
# - budget: the user's; without one, capacity.
# Where memfit does not see the device (a card planned from the CPU, or the
# host without a simulated device), nothing is beside the step and the budget
# is the room; for a card the notes say what memfit cannot see. memfit.Trainer's
# own budget on the CPU is a simulated device its steps run on, and that device
# counts every tracked byte alive (a tensor kept from a memfit.track() block,
# a loss kept with its graph): planned as the room of the whole budget, the
# plan left them out and the first step ran out of memory in the forward.
# Garbage (cycles an earlier step or test left) holds device bytes until
# Python's GC runs, so where anything is beside the step it is counted after
# a collection, as lazy's plan does (Note [Garbage and the plan],
# chunking.py): before, 688 KiB of an earlier test's garbage left a 20 KiB
# budget no room, and the plan and the step ran out of memory.


class DeviceFull(ValueError):
    """The device holds so much beside the step that no room is left."""


@dataclasses.dataclass
class Room:
    """room_bytes: what the step may take. budget_bytes: the budget it comes
    from (the user's, or the device's capacity). beside_bytes: what the
    device holds beside the step, taken out. seen: "simulated", "cuda" or
    None (the device is not seen). notes: one line each, for the answer."""

    room_bytes: int
    budget_bytes: int
    beside_bytes: int = 0
    seen: str | None = None
    notes: list = dataclasses.field(default_factory=list)


def cuda_free_bytes() -> int:
    """The current CUDA device's free memory, with what the caching
    allocator holds but does not use counted as free: it is free to us."""
    free, _ = torch.cuda.mem_get_info()
    return free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()


def _on_cuda(model):
    p = next(model.parameters(), None)
    return p is not None and p.is_cuda


# Note [Parameters no optimizer given steps]
# A loop with two optimizers (a backbone's and a head's, a GAN's) is sized
# with the one optimizer memfit takes: the other's state is not in the
# step, and the answer came out "verified" above what plain steps of the
# loop run (702 for 562, the second optimizer an Adam over most of the
# weights). Trainable parameters that no optimizer given holds are where
# that shows: their .grad are counted, a state kept for them is not, and
# the answer says so. A model whose trainable parameters the optimizer
# holds, or an optimizer memfit makes (a name), says nothing.
def _outside_the_optimizer(model, optimizer) -> list:
    """The note on `model`'s trainable parameters that `optimizer` (a
    torch.optim optimizer) does not hold, or none: See Note [Parameters no
    optimizer given steps]."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        return []
    # Other ranks' shards: See Note [ZeroRedundancyOptimizer measured on this rank's shard].
    optimizer = sharded_optimizer(optimizer) or optimizer
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    out = [p for p in model.parameters() if p.requires_grad and id(p) not in held]
    if not out:
        return []
    size = _memfit.format_bytes(sum(p.numel() * p.element_size() for p in out))
    return [f"{size} of trainable parameters ({len(out)} tensors) are in no optimizer given: "
            f"their .grad are counted, but not the state another optimizer keeps for them (2x "
            f"them for Adam); for a loop with two optimizers pass one that holds as much (an "
            f"Adam over both's parameters), or freeze them (requires_grad=False)"]


def resolve_budget(budget, model: torch.nn.Module, optimizer=None, what: str = "find_batch_size",
                   target_device: str = "cpu", held: bool = True,
                   simulates: bool = False) -> Room:
    """The Room of `budget` (bytes, "16GiB" or None) for `model`'s step with
    `optimizer`: See Note [The budget is the whole device]. held=False: the
    step re-creates the weights and buffers only (an eval step), so the
    .grad and optimizer state are beside it. simulates=True: the caller
    runs the step on a simulated device of `budget` (memfit.Trainer on the
    CPU), which is then the device seen. Raises one-line
    ValueErrors tagged `what` for a budget that is 0, negative or unreadable,
    none where no device is seen, and DeviceFull for a device already full."""
    given = None if budget is None else to_bytes(budget, what)
    if given == 0:
        raise ValueError(f"[{what}] the budget is 0 B ({budget!r}): no step fits in it; pass "
                         f"the memory the step may use, e.g. budget='16GiB'")
    fmt = _memfit.format_bytes
    simulated = _memfit.budget("cpu")
    if simulated is None and simulates and given is not None and not _on_cuda(model):
        simulated = given
    if _on_cuda(model):
        seen = "cuda"
        capacity = torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved()

        def beside_now():
            return max(0, torch.cuda.memory_allocated()
                       - step_bytes(model, optimizer, lambda t: t.is_cuda, held))
    elif simulated is not None:
        seen = "simulated"
        capacity = simulated

        def beside_now():
            tracked = step_bytes(model, optimizer,
                                 lambda t: _memfit.allocation_id(t) is not None, held)
            return max(0, _memfit.tracked_live_bytes("cpu") - tracked)
    elif given is None and torch.cuda.is_available():  # a model on the host, sized for the card
        return Room(cuda_free_bytes(), cuda_free_bytes())
    elif given is None:
        raise ValueError(
            f"[{what}] no budget: pass budget= ('16GiB' or bytes), run inside "
            f"memfit.simulated_device(...), or run on a CUDA device")
    else:
        notes = _outside_the_optimizer(model, optimizer)
        if target_device == "cuda":
            notes.append("the budget is the card's and memfit does not see the card: what "
                         "you keep on it beside this step (an EMA copy, a teacher model) "
                         "must fit in the budget too")
        return Room(given, given, notes=notes)
    beside = beside_now()
    if beside:  # garbage holds device bytes until collected: See the Note
        gc.collect()
        beside = beside_now()
    top = capacity if given is None else min(given, capacity)
    if beside >= top:
        where = "the simulated device's" if seen == "simulated" else "the card's"
        raise DeviceFull(
            f"[{what}] {where} budget of {fmt(top)} is full already: {fmt(beside)} of live "
            f"tensors that are not the model's weights, .grad or optimizer state (the batch, "
            f"your other tensors) leave no room for a step; free them or give the device "
            f"more memory")
    notes = _outside_the_optimizer(model, optimizer)
    if beside and given is not None:
        notes.append(f"{fmt(beside)} live on the device beside the step (tensors that are not "
                     f"the model's weights, .grad or optimizer state: the batch you hold, an "
                     f"EMA copy, a teacher model) are taken out of the budget")
    if given is not None and capacity < given:
        notes.append(f"the device has {fmt(capacity)}, less than the budget of {fmt(given)}: "
                     f"fitted to the device")
    return Room(top - beside, top, beside, seen, notes)
