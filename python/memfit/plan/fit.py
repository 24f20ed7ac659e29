"""memfit.find_batch_size and @memfit.auto_batch_size: the largest batch
that fits, from probes at small batches, without trial-and-error crashes."""

from __future__ import annotations

import dataclasses
import functools
import gc
import inspect
import traceback
import warnings
from typing import Any, Callable

import torch

from .._native import native as _memfit
from .._step.arguments import flag
from .._step.batching import (batch_size, map_tensors, check_samples, count, resize_batch,
                               target_batch_dim_of)
from .._step.device import budget_target, host_memory, to_bytes
from .._step.loop import as_loop, kept_output_note
from .._step.frameworks import accumulation_setter, unwrapped_optimizer
from .._step.hints import Batch, LossFn, OptimizerArg, ProgressArg, Size, StepFn
from .._step.progress import as_progress
from .._step.training_step import builtin_name, check_optimizer
from .._step.user_step import as_user_step
from .._step.optimizer_chain import state_values
from .._step.user_state import RngState, step_bytes, with_loss_module
from ..report.compiled import search_notes
from ..report.value_sized import settle_fit
from ..report.data_parallel import trainable_sizes
from ..report.places import capped_at_budget, place_of
from ..report.step_growth import growth_note
from ..report.profile import profile
from .budget import resolve_budget
from .lengths import LengthFit, fit_lengths, padded_example
from .ranks import LocalAnswer, agreed_across_ranks, rank_local_optimizer

__all__ = ["DoesNotFit", "find_batch_size", "auto_batch_size"]

DoesNotFit = _memfit.DoesNotFit


@agreed_across_ranks  # one answer on every rank: See Note [One answer on every rank]
def find_batch_size(model: torch.nn.Module, inputs: Batch, target: Batch = None,
                    loss_fn: LossFn | None = None, optimizer: OptimizerArg = None,
                    budget: Size | None = None, batch_dim: int = 0, mode: str | None = None,
                    margin: Size = 0, verify: bool = True, progress: ProgressArg = None,
                    target_device: str | None = None,
                    step: StepFn | None = None, seq_dim: Any = None,
                    lengths: Any = None, set_to_none: bool = True,
                    accumulation_steps: int = 1, zero_grad: str = "after_step",
                    train_mode: bool = True, across_ranks: Any = True,
                    target_batch_dim: int | None = None,
                    keep_output: bool = True) -> _memfit.BatchFit | LengthFit:
    """The largest batch whose whole training step fits `budget`, verified.

    `inputs`/`target` are an example batch of any size: memfit records the
    step (forward, loss, backward, optimizer step, two iterations) at batches
    made from them (cut, or repeated: other batches' shapes, the example's
    values; a step whose memory follows the values says so and is not
    verified above the example, See Note [Memory that depends on the batch's
    values]), grown from 2, 4, 8 toward the answer, each first predicted
    from the smaller ones; fits each event's memory as M0 + m*batch on the largest, solves for
    the budget, and runs one whole step at the answer to verify it (see
    Note [Verifying the answer]). If that step does not fit, the next batch
    comes from its measured peak, and is verified again: the answer is always
    a batch measured to fit. verify=False skips that step (for planning
    only); the result then says verified=False.

    budget: bytes or "16GiB", the whole device's: the step starts with what
    the model and optimizer hold now (Adam's state after a step, .grad), and
    on a device memfit sees (the simulated one, the card the model is on)
    the tensors beside the step are taken out (See Note [The budget is the
    whole device], budget.py); default: the device's own (the simulated
    device's budget, else the free CUDA memory). margin: extra bytes to
    keep free. progress: None, True (a line on stderr per recorded phase,
    probe and verification) or a callable given each line.

    The loop you train with, as memfit.profile takes it: set_to_none (how
    your zero_grad frees the gradients), accumulation_steps (micro-batches
    per optimizer step: max_batch is then the micro-batch), zero_grad
    ("after_step" or "before_backward", the tutorial order), train_mode
    (False: measure the model's train/eval flags as they are), keep_output
    (True, the default: your loop holds the model's output until the next
    forward, as `pred = model(X)` does; False: `loss_fn(model(x),
    y).backward()` drops it once the loss exists). The notes say which loop
    the answer is for.

    mode: where each step is measured, as memfit.profile takes it (See
    Note [Measured on the device]): None (the default) measures on the
    device the model is on where memfit sees it (a CUDA card, the
    simulated device), probes and the verifying step included, each held to
    that device's own limit; "cpu" or "meta" rehearse the step to plan a
    card you do not have. An example batch that runs out of memory there is
    cut in half until a step runs, and the search goes on from it.

    target_device: the device the budget is for, "cpu" or "cuda"; None:
    "cuda" when the model's parameters are on a CUDA device, else "cpu".
    For "cuda" each step is recorded as for a card and held against the
    budget by the caching allocator's reserved bytes, replayed on it (more
    than the allocated bytes: cached segments); measured_peak_bytes is
    then reserved bytes and the notes say so.

    step: the user's own step, step(model, batch) -> loss, instead of
    loss_fn and target (memfit.profile's step=); a Hugging Face model with
    labels in its dict batch needs neither.

    A compiled model (torch.compile) is measured as its step runs once
    compiled (see memfit.profile); the probes share one graph with a
    dynamic batch dimension, and the notes say whether the step verified at
    the answer ran that graph or compiled its own.

    A model wrapped in DistributedDataParallel gets each rank's batch: the
    budget first loses DDP's gradient buckets, one copy of the trainable
    parameters (exactly what DDP adds to every phase when .grad are separate
    from the buckets; an upper bound with gradient_as_bucket_view=True), and
    budget_bytes says what is left for the step itself.

    Returns a BatchFit: max_batch, recommended_batch (the largest multiple of 8
    not above max_batch when that gives up at most an eighth of it, else
    max_batch), predicted_peak_bytes, measured_peak_bytes, verified, trials
    (full-size steps run), probes, held_out_error, affine (False when the
    memory per sample changed between probes; notes say so with the
    figures), budget_bytes, margin_bytes, mode, notes. Raises
    memfit.DoesNotFit (a ValueError) with the numbers when even batch 1 does
    not fit.

    seq_dim and lengths: the largest batch at each of `lengths`, the example
    cut or repeated along `seq_dim` (an int, or one per input as batch_dim):
    a LengthFit (memfit.plan.lengths), with at(L) for any length up to the
    longest, table() and max_tokens.

    target_batch_dim: the target's dimension that indexes samples, as
    memfit.profile's (default: batch_dim's first; 0 for a (batch,) label
    beside seq-first inputs of batch_dim=1).

    Under torch.distributed each rank measures its own device and every rank
    gets the same answer, the smallest rank's largest batch (each rank's
    BatchFit measured at it on its own device; a note names the rank that
    limits); when any rank's search raises, every rank raises one error
    naming it (DoesNotFit when each failure was DoesNotFit, else
    memfit.plan.ranks.RankFailed), none left waiting in a collective.
    across_ranks: True (the default process group), False (this rank
    alone) or a ProcessGroup to agree within.
    """
    def args():
        return dict(set_to_none=set_to_none, accumulation_steps=accumulation_steps,
                    zero_grad=zero_grad, train_mode=train_mode, target_batch_dim=target_batch_dim,
                    keep_output=keep_output)
    if seq_dim is not None or lengths is not None:  # one fit per length: plan/lengths.py
        fits = dict(args(), loss_fn=loss_fn, optimizer=optimizer, budget=budget,
                    batch_dim=batch_dim, mode=mode, margin=margin, verify=verify,
                    progress=progress, target_device=target_device, step=step,
                    across_ranks=across_ranks)
        checked = _one_step_peak(_loop_at(model, loss_fn, step, optimizer, batch_dim, mode,
                                          target_device, args())) if flag(
            verify, "find_batch_size", "verify") else None
        return fit_lengths(lambda x, y: find_batch_size(model, x, y, **fits), inputs, target,
                           seq_dim, lengths, batch_dim, step_peak=checked,
                           across_ranks=across_ranks, target_batch_dim=target_batch_dim)
    at = _loop_at(model, loss_fn, step, optimizer, batch_dim, mode, target_device, args(),
                  progress)
    verify = flag(verify, "find_batch_size", "verify")
    margin = to_bytes(margin, "find_batch_size", "margin")
    place_of(mode, at.model, at.target_device, "find_batch_size")  # its checks, tagged as ours
    check_samples(inputs, target, batch_dim, target_batch_dim_of(
        batch_dim, target_batch_dim, "find_batch_size"), "find_batch_size")

    # Batches padded to their longest sample: See Note [A mask without
    # padding] (lengths.py). A mask is (batch, length): its last dimension.
    inputs, padded = padded_example(inputs, -1)

    def room_now():
        return resolve_budget(budget, with_loss_module(at.model, at.how), at.optimizer,
                              "find_batch_size", at.target_device)

    def available_in(room):
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return room.room_bytes
        return _memfit.budget_beside_ddp_buckets(
            room.room_bytes, sum(trainable_sizes(at.model)), "find_batch_size",
            "report.data_parallel()")

    def record():
        return example_that_runs(at.profile, inputs, target, batch_dim, "find_batch_size",
                                 target_batch_dim)

    try:
        room, report = settled_example(room_now, record, at.model)
    except DoesNotFit as e:
        raise cause_at_one_sample(e, at.model, at.optimizer,
                                  available_in(room_now()) - margin, "find_batch_size") from None

    def fit_at_most(cap=None):  # cap: a smaller batch another rank can run (plan/ranks.py)
        fit = settled_search(room_now, room, at.model, lambda r: search(
            report, available_in(r), margin, verify=verify, max_batch=cap,
            progress=at.progress), record)
        # The answer is for this loop, from this state; a compiled model's graphs.
        notes = room.notes + report.loop_notes + search_notes(report, fit)
        notes += output_note(report, fit) + ([padded] if padded else [])
        # See Note [A step whose memory grows step after step] (step_growth.py).
        grows = growth_note(report.phases, report.batch)
        if grows:  # verified on the steps recorded, not on a longer loop
            fit.verified = False
            notes.append(f"unverified: {grows}")
        if notes:
            fit.notes = list(fit.notes) + notes
        # See Note [Memory that depends on the batch's values] (op_frames.h).
        settle_fit(fit, report.value_sized_ops, report.samples)
        return fit

    return LocalAnswer(fit_at_most(), fit_at_most)


@dataclasses.dataclass(frozen=True)
class _LoopAt:
    """A loop's arguments resolved once, and `profile` of that loop at
    (inputs, target): what find_batch_size measures and a fit per length
    checks with."""
    model: torch.nn.Module  # DDP's module: the budget has DDP's buckets out already
    optimizer: Any
    how: Any
    target_device: str
    progress: Any
    profile: Callable


def _loop_at(model, loss_fn, step, optimizer, batch_dim, mode, target_device, loop_args,
             progress=None) -> _LoopAt:
    optimizer = unwrapped_optimizer(optimizer)  # accelerate's or Lightning's wrapper
    optimizer = rank_local_optimizer(optimizer)  # ZeroRedundancyOptimizer's, no collective
    check_optimizer(model, optimizer, "find_batch_size")
    how = as_user_step(loss_fn, step, "find_batch_size", model)
    target_device = budget_target(model, target_device, "find_batch_size")
    loop = as_loop(loop_args["set_to_none"], loop_args["accumulation_steps"],
                   loop_args["zero_grad"], loop_args["train_mode"], "find_batch_size",
                   loop_args["keep_output"])
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    said = as_progress(progress, "find_batch_size")

    def profile_at(x, y):
        return profile(model, x, y, loss_fn=how, optimizer=optimizer, batch_dim=batch_dim,
                       mode=mode, progress=said, target_device=target_device,
                       target_batch_dim=loop_args["target_batch_dim"], **loop.profile_args())
    return _LoopAt(model, optimizer, how, target_device, said, profile_at)


def _one_step_peak(at: _LoopAt):
    """(inputs, target) -> the peak the budget is held against of one step
    of this loop on them, None where it ran out of memory: how a fit per
    length checks between its lengths (See Note [Between measured
    lengths], lengths.py)."""
    def peak(x, y):
        try:
            return at.profile(x, y).budget_peak_bytes
        except torch.cuda.OutOfMemoryError:
            return None
    return peak


def output_note(report, fit) -> list:
    """The note on the model's output, which the step fitted keeps until
    the next forward (Note [The order of a training iteration], report.h),
    where it is 1% of the budget or more at the answer: a loop that drops
    it has that much room to spare; else none."""
    kept = int(report.output_per_sample * fit.max_batch)
    if not report.output_kept or kept * 100 < fit.budget_bytes:
        return []
    return [kept_output_note(kept, fit.max_batch)]


# Note [What a step leaves on the device]
# A step can leave memory on the device for good that is neither the user's
# state nor the batch: cuBLAS takes a 32 MiB workspace per thread at its
# first matrix product past a size and keeps it, and a module can keep a
# cache outside its weights. The room is resolved before any step ran, so
# it did not count them, and every recording after the first counts them
# beside the step: on the H200 the example batch's step made cuBLAS's
# workspaces, its peak held 68 MB that the probes after it did not, and
# the search read that as 17 MB a sample (the MLP at 256 MiB: 8 where
# plain steps ran 12705; every case 0.06-0.75 of the truth). So the room is
# resolved again after the example's step, and where the device holds more
# beside the step than before, that room stands and the example is
# recorded again, now with the same things beside it as every probe. A
# probe that makes more (a larger batch taking another kernel) is found
# after the search, which then runs again in the room that is left
# (settled_search). The callbacks' plan_batch and memfit.Trainer's plan
# take their room the same way (python/tests/test_device_keeps.py: 15 ->
# 683 of 695 for find_batch_size and the callbacks from an example of 8,
# 128 -> 683 from an example of 2 whose probe made it; 512 -> 586 of 616
# for the Trainer).
# What a step leaves may also be its own, replaced by the next step: a
# forward hook that keeps each layer's output (feature extraction) held the
# last probe's activations, which the search took as kept for good and
# answered 561 where plain steps ran 1563. So before searching again, the
# example's step runs once more: what it replaces goes back to the
# example's size, and only what stays (a workspace, a cache per shape) is
# taken out (test_device_keeps.py).
def settled_example(room_now, record, model):
    """(room, report): the Room from room_now() and the example's Report
    from record(), the room taken after one step made whatever the device
    keeps from it: See Note [What a step leaves on the device]. On a card
    (`model`'s), each recording runs capped at the budget: See Note [A card
    capped at the budget] (places.py); the search must run so too."""
    room = room_now()
    with capped_at_budget(model, room.budget_bytes):
        report = record()
        if _first_step_above_the_next(report):  # See Note [Work a process does once]
            report = record()
    after = room_now()
    if after.beside_bytes <= room.beside_bytes:
        return room, report
    with capped_at_budget(model, after.budget_bytes):
        return after, record()


# Note [Work a process does once]
# A step's first run in a process can do work no later step repeats:
# torchao's 8-bit AdamW compiles its step (torch.compile) at its first
# call, and that first optimizer step peaked at 32 MB where every step
# after it, a fresh optimizer's included, peaked at 6.1 MB. Recorded at
# the example, that one-time peak was read as the example's step: the
# probes were "99% off the line" and the answer was 7 where plain steps ran
# 1094 (the compile done by then, as it is for the user's loop after
# find_batch_size). A step's first iteration peaks below its second or
# level with it (the second has the optimizer's state from the start), so
# one that peaks above it did such work: the example is recorded again,
# warm, and searched from that.
def _first_step_above_the_next(report) -> bool:
    """Whether `report`'s first iteration peaked above its second (by more
    than 1/64): See Note [Work a process does once]."""
    peaks = {}
    for p in report.phases:
        peaks[p["iteration"]] = max(peaks.get(p["iteration"], 0), p["peak_bytes"])
    return 2 in peaks and peaks.get(1, 0) * 64 > peaks[2] * 65


def settled_search(room_now, room, model, searched, again):
    """searched(room), a BatchFit, on the device as it is: on a card
    (`model`'s) capped at the budget (Note [A card capped at the budget],
    places.py), and searched again in the room left where a probe left more
    on the device than the example did, once the example's step, again(),
    ran again (Note [What a step leaves on the device]). room_now: the Room
    now, as settled_example's."""
    def capped(r):
        with capped_at_budget(model, r.budget_bytes):
            return searched(r)
    fit, kept = capped(room), room_now()
    if kept.beside_bytes > room.beside_bytes:
        with capped_at_budget(model, room.budget_bytes):
            again()
        kept = room_now()
        if kept.beside_bytes > room.beside_bytes:
            fit = capped(kept)
    return fit


def example_that_runs(profile_at, inputs, target, batch_dim, who, target_dim=None):
    """profile_at(inputs, target), the example batch's Report (target cut
    along target_dim, as profile's target_batch_dim); where the
    device runs out of memory at it (a batch too large for the card or the
    simulated device it is measured on), the example cut in half until a
    step runs: the rehearsal put everything back (Note [A rehearsal that
    runs out of memory puts everything back]), and the search goes on from
    what was measured, its other batches cut from the whole example (real
    samples: a step whose memory follows the values, such as a sparse
    Embedding's gradient, measures them). Raises DoesNotFit when even one
    sample runs out."""
    n = batch_size(inputs, batch_dim, who)
    whole = inputs, target
    while True:
        try:
            report = profile_at(inputs, target)
            return report if inputs is whole[0] else report.from_samples(*whole)
        except torch.cuda.OutOfMemoryError as e:
            first = str(e).splitlines()[0] if str(e) else "out of memory"
            traceback.clear_frames(e.__traceback__)
        if n == 1:
            raise DoesNotFit(f"[{who}] even a batch of 1 ran out of memory where it was "
                             f"measured: {first}")
        n //= 2
        with host_memory():  # memfit's cut of the example, not the step's
            inputs = resize_batch(inputs, n, batch_dim)
            target = None if target is None else resize_batch(
                target, n, target_batch_dim_of(batch_dim, target_dim, who))


def cause_at_one_sample(error, model, optimizer, room, who):
    """What to raise for `error`, example_that_runs's DoesNotFit (even one
    sample ran out where it was measured): where the model's weights,
    buffers, gradients and the optimizer's state alone take the room, a
    refusal that names them (the device's own message said to let memfit
    find a batch, which is what failed); else `error`."""
    held = step_bytes(model, optimizer)  # weights, buffers, .grad and state held now
    trainable = [p for p in model.parameters() if p.requires_grad]
    grads = sum(p.numel() * p.element_size() for p in trainable if p.grad is None)
    spec = _builtin_spec(optimizer)
    fresh = not isinstance(optimizer, torch.optim.Optimizer) or not optimizer.state
    state = spec.states * sum(p.numel() * p.element_size() for p in trainable) \
        if spec is not None and fresh else 0
    if held + grads + state < room:
        return error
    fmt = _memfit.format_bytes
    parts = [f"what the model holds now ({fmt(held)}: weights, buffers, any .grad and "
             f"optimizer state)"]
    if grads:
        parts.append(f"the gradients backward makes ({fmt(grads)})")
    if state:
        named = type(optimizer).__name__ if not isinstance(optimizer, str) else optimizer
        parts.append(f"{named}'s state at its first step ({fmt(state)})")
    return DoesNotFit(
        f"[{who}] not even one sample fits: " + ", ".join(parts) + f" take "
        f"{fmt(held + grads + state)} before any sample, and the budget leaves the step "
        f"{fmt(room)}. Try a bigger budget, an optimizer with less state or its state on the "
        f"host, or lower precision (memfit.advise plans and measures these)")


def _builtin_spec(optimizer):
    """memfit's built-in optimizer `optimizer` is (a name, or a torch
    optimizer built as one), or None."""
    name = optimizer if isinstance(optimizer, str) else (
        builtin_name(optimizer) if isinstance(optimizer, torch.optim.Optimizer) else None)
    return next((s for s in _memfit.builtin_optimizers() if s.name == name), None)


# The core's search and fit name themselves as the command line's `memfit
# fit` does; a Python caller reads its own call's name.
_CORE_TAGS = ("[fit] ", "[fit_batch] ", "[search_batch] ", "[probe] ")


def search(report, available, margin=0, verify=True, max_batch=None, progress=None,
           who="find_batch_size"):
    """The largest batch whose step, as `report` (a memfit.profile Report)
    measures it at other batches, fits `available` bytes less `margin`: the
    search of find_batch_size (see Note [Probing toward the answer] and Note
    [Verifying the answer]). max_batch: no larger batch is wanted (a
    Trainer's whole batch); the search stops there. Returns a BatchFit;
    raises DoesNotFit when even batch 1 does not fit, tagged `who`."""
    kwargs = {} if max_batch is None else {"max_batch": count(max_batch, "search", "max_batch")}

    # Probes end at the example batch when it fits and is large enough to
    # start from: small batches cost their fixed overhead for little.
    if report.batch >= 16 and report.budget_peak_bytes <= available - margin:
        kwargs["first"] = [report.batch // 4, report.batch // 2, report.batch]
    try:
        return _memfit.search_batch(_below_what_ran(report, available - margin), available,
                                    margin, verify=bool(verify),
                                    host_limit=_memfit.probe_memory_limit(report.mode),
                                    progress=as_progress(progress, "search").relay(), **kwargs)
    except ValueError as e:  # DoesNotFit is one
        said = str(e)
        tag = next((t for t in _CORE_TAGS if said.startswith(t)), None)
        if tag is None or isinstance(e, torch.cuda.OutOfMemoryError):
            raise
        raise type(e)(f"[{who}] " + said[len(tag):]) from None


def _below_what_ran(report, room):
    """report.measure_step for the search, where a batch smaller than every
    batch that ran makes the step itself raise (BatchNorm in training takes
    2 samples or more): the search went there because those do not fit, so
    it is DoesNotFit, naming the error, not the model's error alone."""
    peaks = {}

    def measure(n):
        try:
            out = report.measure_step(n)
        except (RuntimeError, ValueError) as e:
            if isinstance(e, (torch.cuda.OutOfMemoryError, DoesNotFit)) or not peaks or \
                    n >= min(peaks):
                raise
            fmt, m = _memfit.format_bytes, min(peaks)
            first = (str(e).splitlines() or [""])[0][:200]
            raise DoesNotFit(
                f"[find_batch_size] even batch {m} does not fit: its step took "
                f"{fmt(peaks[m])}, more than the {fmt(room)} the budget leaves, and batch {n} "
                f"cannot train ({type(e).__name__}: {first}): give a larger budget") from None
        if out is not None:
            peaks[n] = out[0].budget_peak()
        return out
    return measure


# What accelerate's find_executable_batch_size retries at a smaller batch
# besides torch.OutOfMemoryError: the RuntimeErrors a full device raises
# where the allocator's own error is not the one that reaches Python.
_OOM_MESSAGES = (
    " out of memory.",  # CUDA, HIP and XPU where raised as a plain RuntimeError
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",  # cuDNN on a batch too large for its kernels
    "DefaultCPUAllocator: can't allocate memory",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",  # HPU
)


def _ran_out_of_memory(e: BaseException) -> bool:
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return True
    return (isinstance(e, RuntimeError) and len(e.args) == 1 and isinstance(e.args[0], str)
            and any(m in e.args[0] for m in _OOM_MESSAGES))


def _takes_steps(fn, args, kwargs) -> bool:
    """Whether fn(batch_size, accumulation_steps, *args, **kwargs) binds.
    accelerate's own pattern, def train(batch_size, model, optimizer) called
    as train(model, optimizer), takes the batch size alone."""
    try:
        inspect.signature(fn).bind(1, 1, *args, **kwargs)
    except TypeError:
        return False
    return True


# Note [What a call that ran out of memory leaves]
# auto_batch_size calls the user's function again after an OOM, on the same
# model and optimizer. A call that stepped once before its OOM left its
# gradients, Adam's state and updated weights behind: the retry's first step
# added the failed call's gradients to its own and redid samples already
# trained on, and it began with 0.22 MiB more alive (a 19k-parameter MLP
# under Adam). So the weights, buffers, gradients, the optimizer's state and
# hyperparameters, the RNG (torch's, Python's and numpy's; and accelerate's step counter, with
# accelerator=) are copied to the host before the first call
# and put back before each retry: every call starts where the first did.
# When every batch ran out they are put back too, before the error.
# The copies cost host memory (outside the simulated device's budget) only;
# where they would take over half the host memory free (a 7B model's
# weights and Adam state are 84 GiB) none are made: a retry then only drops
# the failed call's gradients, and warns that the rest goes on from there.
def _host_bytes_free() -> int | None:
    """The host memory available now (Linux's MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _copy_bytes(tensors, optimizer):
    """Bytes of the host copies _CallStart keeps: the tensors, their
    gradients and the optimizer's state tensors (meta ones cost none)."""
    held = list(tensors) + [t.grad for t in tensors if getattr(t, "grad", None) is not None]
    if optimizer is not None:
        held += [v for state in optimizer.state.values() for v in state_values(state)
                 if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in held if not t.is_meta)


def _host_copy(t):
    # A meta tensor has no values to copy (and costs no memory).
    return t.detach() if t.is_meta else t.detach().to("cpu", copy=True)


class _CallStart:
    """The model's and optimizer's state before the user's function runs."""

    def __init__(self, model, optimizer, accelerator=None):
        self.model = model
        # accelerate's accumulate() syncs where its step counter is a multiple
        # of the accumulation steps: a failed call's micro-batches moved it.
        self.accelerator = accelerator
        self.accelerator_step = getattr(accelerator, "step", None)
        self.optimizer = optimizer if isinstance(optimizer, torch.optim.Optimizer) else None
        self.tensors = list(model.parameters()) + list(model.buffers())
        self.need = _copy_bytes(self.tensors, self.optimizer)
        free = _host_bytes_free()
        self.kept = free is None or self.need <= free // 2
        self.rng = RngState()
        if not self.kept:
            return  # See Note [What a call that ran out of memory leaves]
        with host_memory():
            self.values = [_host_copy(t) for t in self.tensors]
            self.grads = [None if p.grad is None else _host_copy(p.grad)
                          for p in model.parameters()]
            self.opt = None if self.optimizer is None else map_tensors(
                self.optimizer.state_dict(), _host_copy)

    @torch.no_grad()
    def put_back(self):
        if not self.kept:
            for p in self.model.parameters():
                p.grad = None  # the failed call's gradients would add to the retry's
            warnings.warn(
                f"[auto_batch_size] the retry goes on from the weights and optimizer state the "
                f"call that ran out of memory left: copying them "
                f"({_memfit.format_bytes(self.need)}) would take over half the host memory "
                f"free", stacklevel=4)
        else:
            self._put_back_copies()
        if isinstance(self.accelerator_step, int):
            self.accelerator.step = self.accelerator_step
        self.rng.restore()
        gc.collect()
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    def _put_back_copies(self):
        for p, g in zip(self.model.parameters(), self.grads):
            p.grad = None if g is None else g.to(p.device, copy=True)
        for t, v in zip(self.tensors, self.values):
            t.copy_(v)
        if self.optimizer is not None:
            # Fresh copies: load_state_dict keeps the step counters it is given.
            with host_memory():
                state = map_tensors(self.opt, lambda t: t.clone())
            self.optimizer.load_state_dict(state)


def _call_largest_first(call, divisors, whole, takes_steps, accumulation, start):
    """call(micro[, steps]) at each divisor in turn until one does not run
    out of memory; `start` put back before each retry and after the last."""
    last = None
    for micro in divisors:
        steps = whole // micro
        if accumulation is not None:
            accumulation(steps)
        if last is not None:
            start.put_back()  # See Note [What a call that ran out of memory leaves]
        try:
            return call(micro, steps) if takes_steps else call(micro)
        except RuntimeError as e:  # torch.cuda.OutOfMemoryError is one
            if not _ran_out_of_memory(e):
                raise
            last = str(e)
    start.put_back()  # nothing of the failed calls is left on the device
    raise torch.cuda.OutOfMemoryError(f"[auto_batch_size] even a batch of 1 ran out of memory: "
                                      f"{last}")


def auto_batch_size(starting_batch_size: int = 128, *, model: torch.nn.Module, inputs: Batch,
                    target: Batch = None, loss_fn: LossFn | None = None,
                    optimizer: OptimizerArg = None, budget: Size | None = None,
                    batch_dim: int = 0, step: StepFn | None = None,
                    accelerator: Any = None) -> Callable[[Callable], Callable]:
    """Decorator for people coming from accelerate's find_executable_batch_size.

        @memfit.auto_batch_size(starting_batch_size=256, model=model,
                                inputs=x_example, target=y_example)
        def train(batch_size, accumulation_steps):
            ...   # batch_size * accumulation_steps == 256, always

    The function gets the largest micro-batch that fits (found from probes,
    no crash) that divides `starting_batch_size`, and the accumulation steps
    that keep the effective batch exactly `starting_batch_size`. A function
    with no place for the steps gets only the batch size (accelerate's
    def train(batch_size, model, optimizer), called as train(model,
    optimizer)). The micro-batch is fitted
    for the loop that accumulates (the first micro-batch's gradients alive
    through the later ones) when the whole batch does not fit. If a step
    still runs out of memory, the next smaller divisor is tried, from the
    state the first call began with: the model's weights, buffers and
    gradients, the optimizer's state and the RNG are put back (copies kept on
    the host). step: the user's own step (find_batch_size's step=).

    accelerate: the model and optimizer may be accelerator.prepare()d (the
    step is measured with the optimizer inside accelerate's wrapper).
    With `accelerator=` (or an optimizer accelerate prepared, whose
    accelerator it shares) its gradient_accumulation_steps is set to the
    accumulation steps before each call, so that `with
    accelerator.accumulate(model)` steps the optimizer once per
    `starting_batch_size` samples; on the CPU (the simulated device) the
    next batch accelerate's prepared DataLoader fetches ahead is left room
    for (beside a GPU it waits on the host).
    """
    starting_batch_size = count(starting_batch_size, "auto_batch_size", "starting_batch_size")
    accumulation = accumulation_setter(accelerator, optimizer)
    optimizer = unwrapped_optimizer(optimizer)
    check_optimizer(model, optimizer, "auto_batch_size")
    how = as_user_step(loss_fn, step, "auto_batch_size", model)
    if accumulation is not None and budget_target(model, None, "auto_batch_size") == "cpu":
        # accelerate's DataLoader holds the next batch: on the host, which
        # is the device on the simulated one.
        how = dataclasses.replace(how, held_batches=1)

    def decorate(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            fit = find_batch_size(model, inputs, target, loss_fn=how, optimizer=optimizer,
                                  budget=budget, batch_dim=batch_dim)
            if fit.max_batch < starting_batch_size:
                # fn accumulates: the first micro-batch's gradients are alive
                # through the later ones (See Note [The loop the user runs]).
                fit = find_batch_size(model, inputs, target, loss_fn=how, optimizer=optimizer,
                                      budget=budget, batch_dim=batch_dim, accumulation_steps=2)
            divisors = [d for d in range(starting_batch_size, 0, -1)
                        if starting_batch_size % d == 0 and d <= max(1, fit.max_batch)]
            def call(*sizes):  # the batch size (and steps) first, then the caller's
                return fn(*sizes, *args, **kwargs)

            return _call_largest_first(call, divisors, starting_batch_size,
                                       _takes_steps(fn, args, kwargs), accumulation,
                                       _CallStart(model, optimizer, accelerator))

        return run

    return decorate
