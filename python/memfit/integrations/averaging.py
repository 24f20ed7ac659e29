"""What a weight-averaging callback (Lightning's EMAWeightAveraging,
StochasticWeightAveraging, the user's own around torch's AveragedModel)
allocates when it updates its average after a step: See Note [An average
updated beside the step]."""

from __future__ import annotations

import itertools

import torch
from torch.optim.swa_utils import AveragedModel, get_swa_multi_avg_fn

from .._native import native as _memfit
from ..memory.tracking import track
from .sizing import largest_divisor

__all__: list = []

# Note [An average updated beside the step]
# A callback that keeps an AveragedModel updates it after the optimizer
# step (EMA: each batch; SWA: each epoch), outside the step memfit
# measures. Its copy of the weights is on the device beside the step and
# counted there; its update is not: EMAWeightAveraging's avg_fn computes
# decay * ema + (1 - decay) * p per parameter, three temporaries of the
# largest weight (3 MiB beside a 1 MiB weight). The update runs when the
# step's activations are gone but its gradients and the optimizer's state
# are alive (Lightning zeroes them at the next step), so it lowers the
# batch only through the batch the loop holds beside it; it can still not
# fit at all: a fit said 365, verified, where Lightning's loop with the
# callback ran out of memory at one sample. So the update's own bytes are
# measured by running it on meta copies of the two models' tensors (exact
# sizes, no memory), as update_parameters runs it once its average holds a
# step, and the weights, their gradients, the optimizer's state and the
# batch beside them must fit in the room the budget leaves, or the fit
# raises DoesNotFit naming the callback. Where a smaller batch fits there,
# the batch is lowered to it: a budget that fitted 490 by the step alone
# raised, where Lightning's loop with the callback runs 228.


def averaged_models(callbacks) -> list:
    """The AveragedModel each callback keeps (in its attributes)."""
    return [v for cb in callbacks for v in vars(cb).values() if isinstance(v, AveragedModel)]


def _meta(tensors):
    return [t.detach().to("meta") for t in tensors]


def update_bytes(averaged: AveragedModel, module: torch.nn.Module) -> int:
    """The peak bytes averaged.update_parameters(module) allocates beyond
    the two models' tensors once its average holds a step (its avg_fn's
    or multi_avg_fn's temporaries), measured on meta copies."""
    with_buffers = bool(averaged.use_buffers)
    ours = _meta(itertools.chain(averaged.module.parameters(),
                                 averaged.module.buffers() if with_buffers else ()))
    theirs = _meta(itertools.chain(module.parameters(),
                                   module.buffers() if with_buffers else ()))
    pairs = [(a, b) for a, b in zip(ours, theirs) if a.is_floating_point()]
    if not pairs:
        return 0
    n = torch.ones(())  # n_averaged stays on the host, as update_parameters reads it
    with torch.no_grad(), track() as t:
        if averaged.multi_avg_fn is not None or averaged.avg_fn is None:
            average = averaged.multi_avg_fn or get_swa_multi_avg_fn()
            average([a for a, _ in pairs], [b for _, b in pairs], n)
        else:
            for a, b in pairs:
                a.copy_(averaged.avg_fn(a, b, n))
    return t.peak_bytes


def check_averaging(callbacks, module: torch.nn.Module, plan, batch_bytes: float,
                    what: str, lowers: bool = False) -> None:
    """Raises DoesNotFit where an average `callbacks` update after the step
    does not fit beside what the step leaves alive (`plan`, a BatchPlan:
    its room and the optimizer's state measured; batch_bytes: the loop's
    batch); else adds a note. See Note [An average updated beside the step].
    lowers=True: where a smaller batch fits beside the update, plan's batch
    is lowered to it (batch_bytes: plan.batch_size samples)."""
    found = [(type(cb).__name__, m) for cb in callbacks for m in averaged_models([cb])]
    if not found:
        return
    update = max(update_bytes(m, module) for _, m in found)
    weights = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    alive = 2 * weights + plan.optimizer_state_bytes + int(batch_bytes)  # weights and .grad
    names = " and ".join(dict.fromkeys(name for name, _ in found))
    fb = _memfit.format_bytes
    if lowers and alive + update > plan.budget_bytes and batch_bytes > 0:
        per_sample = batch_bytes / plan.batch_size
        room = plan.budget_bytes - (alive - int(batch_bytes)) - update
        fits = int(room // per_sample) if room > 0 else 0
        if fits >= 1:
            _lower(plan, fits)
            plan.notes.append(f"{names} updates its average after each step with {fb(update)} "
                              f"of temporaries beside the weights, .grad, the optimizer's state "
                              f"and the loop's batch: the batch is lowered to {plan.batch_size}, "
                              f"which fits beside them")
            return
    if alive + update > plan.budget_bytes:
        raise _memfit.DoesNotFit(
            f"[{what}] {names} updates its average after each step with {fb(update)} of "
            f"temporaries while the trained weights, their .grad and the optimizer's state "
            f"({fb(alive)} with the batch) are alive: {fb(alive + update)}, above the "
            f"{fb(plan.budget_bytes)} the budget leaves beside the model and the average; give "
            f"a larger budget, keep the average on the host (device='cpu'), or a lighter "
            f"optimizer")
    plan.notes.append(f"{names} updates its average after each step with {fb(update)} of "
                      f"temporaries: it fits beside the weights, .grad and optimizer state "
                      f"({fb(alive + update)} of {fb(plan.budget_bytes)})")


def _lower(plan, batch: int) -> None:
    """plan's batch set to at most `batch`, its accumulation kept to the
    effective batch where one is kept."""
    batch = min(batch, plan.batch_size)
    if plan.effective_batch is not None:
        batch = largest_divisor(plan.effective_batch, batch)
        plan.accumulation = plan.effective_batch // batch
    plan.batch_size = batch


# Note [An average moved onto the device later]
# Lightning's StochasticWeightAveraging copies the module in its setup,
# before the strategy moves the module to the accelerator: the copy is on
# the host through on_fit_start, and moves to `device` (None: the module's)
# at swa_epoch_start, where it stays beside every later step. Where the
# copy was made on the host (a GPU's run; on a simulated device, the
# host's memory) FitBatchSize said 556 and Lightning's loop ran out of
# memory at the first SWA epoch; it runs 369 at most. So the copy's bytes
# not on the device yet are kept free beside the step when it moves to the
# module's device. A copy made on the device is in its live bytes already
# (See Note [The budget is the whole device], plan/budget.py).


def _on_the_device(t: torch.Tensor, device: torch.device) -> bool:
    """Whether `t` is on `device` as the budget sees it: a card's tensor, or
    one the simulated device tracks."""
    if device.type == "cuda":
        return t.device == device
    return _memfit.budget("cpu") is not None and _memfit.allocation_id(t) is not None


def moved_average_bytes(callbacks, module: torch.nn.Module) -> tuple[int, list]:
    """(bytes, names): the copies of the weights that averaging callbacks
    keep off the device now and move onto the module's device later (See
    Note [An average moved onto the device later]), and the callbacks'
    names."""
    first = next(itertools.chain(module.parameters(), module.buffers()), None)
    device = torch.device("cpu") if first is None else first.device
    total, names = 0, []
    for cb in callbacks:
        copy, to = getattr(cb, "_average_model", None), getattr(cb, "_device", None)
        if not isinstance(copy, torch.nn.Module) or isinstance(copy, AveragedModel):
            continue
        to = device if to is None else torch.device(to)
        if to.type != device.type or (None not in (to.index, device.index)
                                      and to.index != device.index):
            continue  # kept apart, where the user asked (device="cpu" beside a card)
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for t in itertools.chain(copy.parameters(), copy.buffers())
                    if not _on_the_device(t, device)}
        if storages:
            total += sum(storages.values())
            names.append(type(cb).__name__)
    return total, names
