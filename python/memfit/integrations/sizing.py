"""The batch a framework's own loop can run, sized from the user's step: the
planning the Lightning and Hugging Face callbacks share. Each callback says
how its framework runs the step (a UserStep, whether the gradients are
alive through the next forward, what its loop holds beside the step) and
gets a BatchPlan to apply."""

from __future__ import annotations

import dataclasses
import warnings

import torch

from .._native import native as _memfit
from .._step.batching import batch_size, count, resize_batch, tensors_in
from .._step.device import budget_target, host_memory, to_bytes
from .._step.user_state import kept_rng
from .._step.user_step import UserStep
from ..plan.budget import resolve_budget
from ..plan.fit import (DoesNotFit, cause_at_one_sample, example_that_runs, search,
                        settled_example, settled_search)
from ..plan.ranks import LocalAnswer, agree
from ..plan.strategies.eval_step import profile_eval
from ..report.profile import Report, profile
from ..report.value_sized import settle_fit

__all__ = ["BatchPlan", "LoopStep", "batch_bytes_per_sample", "example_of", "plan_batch",
           "plan_eval_batch", "check_options", "tell_change"]


@dataclasses.dataclass
class BatchPlan:
    """What a callback measured and set.

    batch_size: the batch each step of the loop runs; accumulation: the
    steps accumulated per optimizer step (1: none), so that batch_size x
    accumulation == effective_batch when one was kept (None: not asked);
    max_batch: the largest batch measured to fit this loop; fits: the
    BatchFit of each search run (steps: sum of their trials, the full-size
    steps spent); reserved_bytes: kept free beside the step for what the
    loop holds (batches fetched ahead); eval_batch_size: the evaluation
    batch sized separately (None: not sized); optimizer_state_bytes: the
    state the step's optimizer keeps (alive through an evaluation during
    training); notes: one line each."""

    batch_size: int
    accumulation: int = 1
    effective_batch: int | None = None
    max_batch: int = 0
    fits: list = dataclasses.field(default_factory=list)
    budget_bytes: int = 0
    reserved_bytes: int = 0
    eval_batch_size: int | None = None
    optimizer_state_bytes: int = 0
    notes: list = dataclasses.field(default_factory=list)

    @property
    def full_size_steps(self) -> int:
        """Whole steps the searches ran at sizes they answered with (their
        verification; probes are smaller)."""
        return sum(f.trials for f in self.fits)

    def summary(self) -> str:
        """The plan in one line."""
        fb = _memfit.format_bytes
        acc = (f" x {self.accumulation} accumulated = {self.effective_batch}"
               if self.effective_batch is not None else "")
        ev = "" if self.eval_batch_size is None else f"; eval batch {self.eval_batch_size}"
        return (f"memfit: batch {self.batch_size}{acc} (largest that fits {self.max_batch}, "
                f"budget {fb(self.budget_bytes)}, {fb(self.reserved_bytes)} kept for the "
                f"loop's batches){ev}")


def check_options(what: str, budget=None, target_device=None, batch_dim: int = 0) -> None:
    """Refuses, when a callback is made, the options its fit would trip on
    only once the framework ran up to it."""
    if budget is not None:
        to_bytes(budget, what)
    if target_device not in (None, "cpu", "cuda"):
        raise ValueError(f"[{what}] target_device must be 'cpu' or 'cuda' (the card the budget "
                         f"is for) or None, got {target_device!r}")
    if isinstance(batch_dim, bool) or not isinstance(batch_dim, int):
        raise ValueError(f"[{what}] batch_dim must be an int (the dimension of the samples), "
                         f"got {type(batch_dim).__name__} {batch_dim!r}")


def tell_change(what: str, before: str, plan: BatchPlan, seconds: float) -> None:
    """Says, as a UserWarning of one line, that the callback `what` changed
    the user's batch (`before`, as the user set it) to the plan's, and
    why; nothing when the plan keeps it."""
    after = (f"{plan.batch_size} x {plan.accumulation}" if plan.effective_batch is not None
             else str(plan.batch_size))
    if after == before:
        return
    fb = _memfit.format_bytes
    warnings.warn(
        f"[{what}] batch {before} -> {after}: the largest batch that fits is "
        f"{plan.max_batch} under the budget of {fb(plan.budget_bytes)} (measured in "
        f"{seconds:.1f} s; its .plan says more)", UserWarning, stacklevel=3)


def largest_divisor(n: int, limit: int) -> int:
    """The largest d dividing n with d <= limit (at least 1)."""
    best = 1
    d = 1
    while d * d <= n:
        if n % d == 0:
            for c in (d, n // d):
                if best < c <= limit:
                    best = c
        d += 1
    return best


def batch_bytes_per_sample(batch, batch_dim=0) -> float:
    """Bytes the batch's tensors hold per sample (tensors shared by every
    sample spread over them: an upper bound for a bigger batch)."""
    n = batch_size(batch, batch_dim, "batch")
    storages = {}
    for t in tensors_in(batch):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values()) / n


def example_of(batch, batch_dim=0, samples=2):
    """The first `samples` samples of a batch the loader gave, copied to
    host memory (outside a simulated device's budget): the probes grow
    from it, and the loader's whole batch can go."""
    n = batch_size(batch, batch_dim, "batch")
    with host_memory():
        return resize_batch(batch, min(n, samples), batch_dim)


def _available(budget, model, what, optimizer=None, held=True):
    # See Note [The budget is the whole device] (plan/budget.py).
    return resolve_budget(budget, model, optimizer, what, held=held).room_bytes


@dataclasses.dataclass(frozen=True)
class LoopStep:
    """How a framework's loop runs one step: the step (a UserStep), and
    whether the gradients are freed when a step ends (set_to_none=True) or
    stay alive through the next forward (False: accumulated micro-batches;
    Lightning, which zeroes them only after training_step: its UserStep
    frees them there); keep_output: whether what the step returns stays
    alive through the next forward (False: a framework's loop hands it to
    its hooks and drops it as the batch ends; Lightning's kept outputs,
    training_step's dict to a list, are held apart: See Note [What
    training_step keeps over an epoch], lightning_rehearsal.py)."""

    how: UserStep
    set_to_none: bool = True
    keep_output: bool = False


def _check_reserve(reserve: int, available: int, effective, reserved_for, what: str) -> None:
    """Raises where what plan_batch keeps free beside the step leaves no room."""
    if not reserve or reserve < available:
        return
    fb = _memfit.format_bytes
    if reserved_for:
        raise _memfit.DoesNotFit(
            f"[{what}] {reserved_for} ({fb(reserve)}) leaves nothing of the {fb(available)} the "
            f"budget leaves beside the model: give a larger budget")
    # The margin is the callback's own, not one the user gave: say what it is.
    raise ValueError(
        f"[{what}] the batches the loop holds beside the step ({fb(reserve)} for {effective} "
        f"samples) leave nothing of the {fb(available)} the budget leaves beside the model: "
        f"give a larger budget or a smaller effective batch")


def plan_batch(model: torch.nn.Module, batch, optimizer, *, whole: LoopStep,
               accumulated: LoopStep | None = None, budget, what: str, batch_dim=0,
               effective: int | None = None, reserve_bytes: int = 0,
               reserved_for: str | None = None,
               target_device: str | None = None) -> BatchPlan:
    """The batch (and accumulation) a loop can use on `model`.

    `batch`: an example batch (any size: probes cut or repeat it). `whole`:
    the loop's step without accumulation; `accumulated`: its step between
    the micro-batches of an accumulated one (default `whole` with the
    gradients kept). `reserve_bytes`: kept free beside the step (for
    `reserved_for`, default the loop's batches).

    Without `effective`: the largest batch `whole` fits, verified. With it:
    does the effective batch fit whole (probes only, as the Trainer's first
    question, Note [The first micro-batch from the fit], trainer.py)? Else
    the largest batch `accumulated` fits, verified, and of it the largest
    divisor of `effective`: batch x accumulation == effective exactly."""
    available = _available(budget, model, what, optimizer)
    target = budget_target(model, target_device, what)
    plan = BatchPlan(batch_size=0, effective_batch=effective, budget_bytes=available,
                     reserved_bytes=int(reserve_bytes))
    _check_reserve(int(reserve_bytes), available, effective, reserved_for, what)

    def fit(loop, verify, max_batch):
        # Every rank the same batch, or the same error: See Note [One answer
        # on every rank] (plan/ranks.py); one rank alone, this rank's.
        def answer():
            with kept_rng():
                # Measured where the model is, an example too large cut: See
                # Note [Measured on the device] (report/places.py); the room
                # as the device is after a step: Note [What a step leaves on
                # the device] (plan/fit.py).
                def room_now():
                    return resolve_budget(budget, model, optimizer, what)

                def record():
                    return example_that_runs(
                        lambda x, _: profile(model, x, loss_fn=loop.how, optimizer=optimizer,
                                             batch_dim=batch_dim, set_to_none=loop.set_to_none,
                                             target_device=target, keep_output=loop.keep_output),
                        batch, None, batch_dim, what)

                try:
                    room, report = settled_example(room_now, record, model)
                except DoesNotFit as e:
                    raise cause_at_one_sample(e, model, optimizer, min(
                        available, room_now().room_bytes) - int(reserve_bytes), what) from None
            plan.optimizer_state_bytes = max(plan.optimizer_state_bytes,
                                             optimizer_state_bytes(report.timeline))

            def at_most(cap):
                f = settled_search(room_now, room, model, lambda r: search(
                    report, min(available, r.room_bytes), int(reserve_bytes), verify=verify,
                    max_batch=cap, who=what), record)
                # The example's few samples repeated: See Note [Memory that
                # depends on the batch's values] (op_frames.h).
                settle_fit(f, report.value_sized_ops, report.samples)
                return f

            # Another rank's cap is below this rank's answer, so below max_batch.
            return LocalAnswer(at_most(max_batch), at_most)

        f = agree(answer, what=what)
        plan.fits.append(f)
        return f

    if effective is None:
        plan.max_batch = plan.batch_size = fit(whole, True, None).max_batch
        return plan
    effective = count(effective, what, "the effective batch")
    if fit(whole, False, effective).max_batch >= effective:
        plan.max_batch = plan.batch_size = effective
        return plan
    if accumulated is None:
        accumulated = dataclasses.replace(whole, set_to_none=False)
    split = fit(accumulated, True, effective)
    plan.max_batch = split.max_batch
    plan.batch_size = largest_divisor(effective, split.max_batch)
    plan.accumulation = effective // plan.batch_size
    if plan.batch_size < 0.75 * split.max_batch:
        plan.notes.append(
            f"{effective} has no divisor between {plan.batch_size} and {split.max_batch}, the "
            f"largest batch that fits: an effective batch with more divisors (a multiple of 8) "
            f"would run fewer, larger steps"
        )
    return plan


def one_step_peak(model: torch.nn.Module, optimizer, loop: LoopStep, *, batch_dim=0,
                  target_device: str | None = None, what: str):
    """batch -> the peak the budget is held against of one step of `loop`
    on it, None where it ran out of memory (a fit per length checks its
    gaps with it: Note [Between measured lengths], plan/lengths.py)."""
    target = budget_target(model, target_device, what)

    def peak(batch, _target=None):
        try:
            with kept_rng():
                return profile(model, batch, loss_fn=loop.how, optimizer=optimizer,
                               batch_dim=batch_dim, set_to_none=loop.set_to_none,
                               target_device=target,
                               keep_output=loop.keep_output).budget_peak_bytes
        except torch.cuda.OutOfMemoryError:
            return None
    return peak


def plan_eval_batch(model: torch.nn.Module, batch, how: UserStep, *, budget, what: str,
                    batch_dim=0, held_bytes: int = 0, cap: int | None = None,
                    target_device: str | None = None):
    """(the largest evaluation batch that fits, its BatchFit): forward and
    loss under torch.no_grad() with the model in eval mode, beside
    `held_bytes` the training holds meanwhile (optimizer state, its
    batches), capped at `cap`."""
    available = _available(budget, model, what, held=False)
    target = budget_target(model, target_device, what)

    def record_at(n):
        with host_memory():
            x = resize_batch(batch, n, batch_dim)
        with kept_rng():
            r = profile_eval(model, x, None, how, "no_grad", batch_dim)
        if target == "cuda":
            r.native.set_cuda_estimate(r.timeline)
        return r.native, r.timeline

    if int(held_bytes) >= available:
        fb = _memfit.format_bytes
        raise _memfit.DoesNotFit(
            f"[{what}] no evaluation batch fits: what the training holds beside it "
            f"({fb(int(held_bytes))}) takes the whole {fb(available)} of the budget")
    native, timeline = record_at(batch_size(batch, batch_dim, what))
    report = Report(native, timeline, record_at=record_at)
    kwargs = {} if cap is None else {"max_batch": cap}
    f = search(report, available - int(held_bytes), verify=True, who=what, **kwargs)
    return f.max_batch, f


def optimizer_state_bytes(timeline) -> int:
    """The optimizer state alive at the end of a recorded step."""
    n = len(timeline)
    return int(timeline.breakdown_after(n - 1)["categories"].get("optimizer_state", 0)) if n else 0
