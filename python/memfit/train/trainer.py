"""memfit.Trainer: the batch you asked for, in micro-batches that fit."""

from __future__ import annotations

import dataclasses
import traceback
import warnings
from typing import Any

import torch

from .._native import native as _memfit
from .._step.arguments import flag
from .._step.batching import (batch_size, count, map_tensors, narrow_batch,
                              sequence_length, tensors_in)
from .._step.device import host_memory, to_bytes
from .._step.frameworks import unwrapped_optimizer
from .._step.hints import Batch, LossFn, Size, StepFn
from .._step.training_step import check_loss_trains, check_optimizer
from .._step.user_step import StepError, as_user_step, is_hf_model
from .._step.user_state import step_parameters, with_loss_module
from ..plan import fit as fitting
from ..plan.budget import DeviceFull, resolve_budget
from ..report.profile import profile
from ..plan.ranks import LocalAnswer, agree, rank_local_optimizer
from .distributed import DistributedStep, RankPlan, batch_signature, is_distributed
from .length_sampler import LengthBatchSampler
from .loss_weighting import LossWeighting, StepRerun
from .step_guard import InPlaceWrites, StepGuard
from .step_notes import batchnorms, coupled_layers, split_notes

__all__ = ["Trainer"]


def _grad_slots(model):
    """Each parameter's .grad as the object and its version."""
    return [None if p.grad is None else (id(p.grad), p.grad._version)
            for p in model.parameters()]


def _check_grads_kept(before, after):
    """Raises ValueError when a step function zeroed (or wrote) the .grad
    the earlier micro-batches accumulated: split, it trained on the last
    micro-batch's gradients alone (0.18 off the whole batch's), silently."""
    if any(b is not None and a != b for b, a in zip(before, after)):
        raise ValueError(
            "[Trainer.step] the step zeroed the .grad the earlier micro-batches accumulated "
            "(zero_grad inside it): split, only the last micro-batch's gradients would be "
            "left; take zero_grad out of the step (memfit runs it once per step)")


# Note [Out of memory inside the backward's Python code]
# The native step runs each micro-batch's backward in C++ and recovers from
# the out-of-memory error a kernel raises there. A Python hook the backward
# calls (torch.utils.checkpoint recomputing the forward, a custom
# autograd.Function's backward) raises Python's OutOfMemoryError instead,
# which reaches C++ as another error, and the step failed: a checkpointed
# model's step that ran out of memory in the recompute raised RuntimeError
# where the same model unchecked recovered. The failed step did not happen
# (its gradients dropped, the buffers, the RNG and the optimizer's new state
# put back), so the step is run again from its start in micro-batches half as
# large: each sample counted once, as a micro-batch redone is. A forward
# that wrote into the user's samples in place is not run again (the write
# would apply twice), nor a distributed step (every rank would have to):
# that error is raised as it came.


def _weighted_step(opt_step, optimizer, weighting):
    """opt_step, after dividing the accumulated gradients by the batch's
    counted targets when the chunks' losses were their sums (Note [Probing
    how the loss reduces], loss_weighting.py). A closure, as _scaled_step."""

    def step():
        scale = weighting.grad_scale()
        if scale is not None:
            # In place; the scalar torch wraps for mul_ on the CPU is the
            # host's, as beside a GPU (an 8-byte OOM here would end the step).
            with torch.no_grad(), host_memory():
                for group in optimizer.param_groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            p.grad.mul_(scale)
        opt_step()

    return step


def _say_written(error, line):
    """Adds `line` to the failed step's error (See Note [An optimizer step
    that fails part way], step_guard.py): a note, or before Python 3.11 a
    warning."""
    if not line:
        return
    if hasattr(error, "add_note"):
        error.add_note(line)
    else:
        warnings.warn(line, RuntimeWarning, stacklevel=4)


def _check_scaler(scaler):
    """None, or an object with GradScaler's scale/step/update/is_enabled."""
    if scaler is None:
        return
    missing = [m for m in ("scale", "step", "update", "is_enabled")
               if not callable(getattr(scaler, m, None))]
    if missing:
        raise ValueError(
            f"[Trainer] scaler must be a torch.amp.GradScaler (or None), got "
            f"{type(scaler).__name__} {scaler!r:.60}, which has no {', '.join(missing)}")


def _current_step(optimizer):
    """optimizer.step as it is when the step runs, not when the Trainer was
    made: a wrapper set on it later (an LR scheduler's, which counts the
    calls; the user's, which clips the gradients) runs, as in the user's
    own loop. A closure over the optimizer only, as _scaled_step."""

    def step():
        optimizer.step()

    return step


def _scaled_step(optimizer, scaler):
    """GradScaler's step: unscale the accumulated gradients, step unless
    one is inf/NaN, update the scale. A closure over the optimizer and the
    scaler only: the native Trainer holds it, and a bound method of the
    Python Trainer would make a cycle through C++ that gc cannot free."""

    def step():
        scaler.step(optimizer)
        scaler.update()

    return step


# Note [The first micro-batch from the fit]
# Under a budget, the Trainer's first micro-batch is not found by running out
# of memory (halve on each OOM, so that the first step of a batch that must
# be split recovered OOMs): before the first step that has a budget (its
# own, or a memfit.simulated_device around it, on the CPU; the card's free
# memory on CUDA) the step is measured on the user's model with
# find_batch_size's search (Report.measure_step -> _memfit.search_batch, see
# Note [Probing toward the answer] and Note [Verifying the answer]), capped
# at the batch, as `memfit train` does (train_command.cpp). Two questions:
#
# 1. Does the batch fit whole? Measured as a whole step runs (gradients
#    freed by zero_grad(set_to_none=True)): probes grown toward the batch,
#    not verified: the fit's answer, its residual kept free, is trusted and
#    the step itself is the check. Cost: the probes, fewer samples in all
#    than a quarter of the batch, two iterations each.
# 2. If not: the largest micro-batch. From the second micro-batch on the
#    accumulated gradients are alive through the next forward and backward,
#    so the step is measured with them kept (profile(set_to_none=False));
#    measured with set_to_none the C++ fit came out one sample too large and
#    step 2 recovered an OOM. Verified by one to four whole steps at the
#    answer (two iterations each), on top of the probes again. The batch is
#    then cut into as many micro-batches as that answer needs, of equal size
#    (256 samples with an answer of 67: 4 x 64, not 67, 67, 67, 55): never
#    above the measured answer, and no more micro-batches.
#
# The probes run on the first two samples of the user's batch repeated to
# each probe's size (their shapes; the values are those samples'), under the user's
# autocast, on copies: the weights, .grad, buffers, optimizer state, inputs
# and RNG are left as they were (Note [A rehearsed step leaves no trace],
# _step/user_state.py). The room is the budget less the live tracked tensors that
# are not the model's (the batch on the device, optimizer state); the
# probes' memory shows in a memfit.track() around the step, not in the
# StepReport. OOM recovery stays the safety net: a micro-batch that runs out
# of memory all the same is halved and redone as before.
#
# Not planned (nothing measured, nothing spent): split=False, micro_batch=
# given, plan=False, BatchNorm in training mode with coupled="error" (the
# batch cannot be split anyway), a batch of one sample, and no budget (the
# CPU without one). A target batched along another dimension than the
# inputs is resized along its own (target_batch_dim, as profile's).
# Planned again after set_budget(), and when a batch
# larger than the one planned whole arrives. When the plan cannot answer
# (even one sample does not fit, or a probe raised), the step runs as it did
# without it, and its own message says what does not fit; trainer.planned
# says why.
#
# On CUDA the probes are CPU steps (as find_batch_size's), recorded for the
# card: each is held against the caching allocator's reserved bytes replayed
# on it (cuBLAS's workspace included), not the allocated ones, which a card
# exceeds. Question 2 runs unverified (a CPU step verifies nothing about the
# card): the largest probe's reserve gap is kept free, and what the replay
# misses is left to the safety net. Not checked on a GPU yet.


# Note [One micro-batch on every rank]
# Under DistributedDataParallel each rank plans on its own device (another
# budget, another card), so alone the ranks could start from different
# micro-batches: a step takes as long as its slowest rank, and a rank whose
# plan failed would be left out of the collectives the others enter. So the
# plan is agreed through plan/ranks.py (See Note [One answer on every rank]):
# - The step's first exchange (distributed.py) says whether any rank would
#   plan (Note [The first micro-batch from the fit]: the first step, after
#   set_budget, a larger batch); if one would, every rank plans, together.
# - Each rank answers the largest micro-batch that fits its device (both
#   questions measured there); a rank that fits its whole batch answers the
#   largest local batch of any rank (no limit on the others); one with
#   nothing to measure (no budget, plan=False, micro_batch=) its own
#   micro-batch, or no limit. The ranks take the smallest; a rank whose own
#   is larger is measured again capped at it (its split fit holds its own
#   device's truth there); each cuts its batch evenly at it, and the step's
#   second exchange starts every rank from the smallest cut. With equal
#   local batches that is one micro-batch and one count of micro-batches.
# - Unlike one process, a plan that cannot answer raises on every rank
#   (memfit.DoesNotFit naming the rank(s) when even one sample does not fit
#   there, else memfit.RankFailed), before any micro-batch runs: warning and
#   starting whole would leave the others to OOM-recover alone.
# trainer.planned.notes says whose micro-batch it is. seq_dim= is not
# planned per length under DDP (each batch's length differs per rank).


@dataclasses.dataclass
class MicroBatchPlan:
    """What the Trainer measured before its first step under a budget (see
    Note [The first micro-batch from the fit]): the batch planned for, the
    micro-batch it starts from (0: whole), the fits of the two questions
    (`whole`: does the batch fit whole; `split`: the largest micro-batch
    with the gradients accumulated, None when not asked), the room in bytes
    and, when no plan was made, why. max_batch: the largest micro-batch
    that fits (the batch itself when it fits whole); under DDP the one the
    ranks agreed on, and notes say whose it is (See Note [One micro-batch on
    every rank])."""

    batch: int
    micro_batch: int = 0
    room_bytes: int = 0
    whole: object = None
    split: object = None
    failed: str = ""
    max_batch: int = 0
    notes: list = dataclasses.field(default_factory=list)

    def cut(self):
        """Sets micro_batch from max_batch: the batch whole if it fits, else
        cut evenly (even_micro_batch)."""
        self.micro_batch = 0 if self.max_batch >= self.batch else even_micro_batch(
            self.batch, max(1, self.max_batch))
        return self


def _check_not_meta(model):
    """A model on the meta device has shapes and no data: a step cannot run."""
    if any(t.device.type == "meta" for t in list(model.parameters()) + list(model.buffers())):
        raise ValueError(
            f"[Trainer] {type(model).__name__} is on the meta device (shapes, no data): a "
            f"step cannot train it. Plan on meta with memfit.advise(model, ...), then build the "
            f"model on a real device (model.to_empty(device=...) and load its weights) to train"
        )


def even_micro_batch(batch, largest):
    """The micro-batch that cuts `batch` samples into as many equal parts as
    micro-batches of `largest` would: never above `largest`."""
    parts = -(-batch // largest)
    return -(-batch // parts)


# Note [A micro-batch per length]
# With variable-length data a batch's memory depends on its padded length L
# as much as on its samples: the micro-batch planned at the first batch
# (Note [The first micro-batch from the fit]) runs out of memory on a longer
# one, and one planned at the longest wastes the short ones. Given seq_dim=
# and lengths=, each step reads L from its inputs and takes fit.at(L), the
# largest batch measured to fit at L (between measured lengths from their
# lines, never above what fits: Note [Between measured lengths],
# lengths.py): the batch runs whole if it holds no more, else in even
# micro-batches of at most that. A fit the Trainer makes itself is measured
# with the gradients kept (set_to_none=False), as they are alive between
# micro-batches; a LengthFit given is trusted as it was measured (a
# whole-step fit is right for batches that fit whole, as a
# LengthBatchSampler's are), and OOM recovery stays the safety net.


def _length_options(seq_dim, lengths):
    """(seq_dim, a LengthFit or None until measured, the lengths to fit)."""
    if seq_dim is None and lengths is None:
        return None, None, None
    if seq_dim is None or lengths is None:
        raise ValueError(f"[Trainer] a micro-batch per length takes both seq_dim= (the inputs' "
                         f"length dimension) and lengths= (the lengths to fit, a LengthFit or "
                         f"a LengthBatchSampler); got seq_dim={seq_dim!r}, lengths={lengths!r}")
    if isinstance(lengths, LengthBatchSampler):
        return seq_dim, lengths.fit, None
    if callable(getattr(lengths, "at", None)):
        return seq_dim, lengths, None
    if isinstance(lengths, int) or not hasattr(lengths, "__iter__"):
        raise ValueError(f"[Trainer] lengths must be a list of ints, a LengthFit or a "
                         f"LengthBatchSampler, got {type(lengths).__name__} {lengths!r}")
    return seq_dim, None, [count(n, "Trainer", "each of lengths") for n in lengths]


def _failure(e):
    """What a plan that could not answer says: the error's type and first
    line (an OOM's allocator figures only: its advice is for a step)."""
    text = str(e).splitlines()[0] if str(e) else ""
    if isinstance(e, torch.OutOfMemoryError):
        text = "the rehearsal ran out of memory: " + (_memfit.allocator_figures(text) or text)
    return f"{type(e).__name__}: {text}"


class Trainer:
    """Run one optimizer step on a batch of any size under a memory budget.

        trainer = memfit.Trainer(model, optimizer, loss_fn=nn.CrossEntropyLoss(),
                                 budget="4GiB")
        report = trainer.step(inputs, target)   # never OOMs while 1 sample fits

    The batch is split along `batch_dim` (an int, or one entry per input
    with None for an input shared by every sample, such as a mask of shape
    (1, ...): batch_dim=(0, None)) into micro-batches that fit; each
    micro-batch's loss is weighted (mean: its share of the batch; sum: 1) so
    the accumulated gradients equal the full batch's; then one optimizer step
    and zero_grad(set_to_none=True). An OOM in a micro-batch halves it and
    redoes it: gradients already accumulated stay, no sample is dropped or
    counted twice, and later steps start from the size that worked.

    Under a budget the first micro-batch is measured, not found by running
    out of memory: before the first step with a budget, memfit probes the
    step on a few samples (on copies: nothing of yours changes) and starts
    from the largest micro-batch that find_batch_size's search verifies
    fits with the gradients accumulated, cut evenly; OOM recovery stays the
    safety net. It costs the probes (under a quarter of the batch's
    samples, two iterations each) and, when the batch must be split, one
    to four steps at the micro-batch. plan=False skips it (then the first
    micro-batch is found by OOM recovery); micro_batch= and split=False
    skip it too. Under DDP every rank plans and they agree on one
    micro-batch (See Note [One micro-batch on every rank]). trainer.planned
    says what was measured. See Note [The first micro-batch from the fit].

    - budget: "16GiB", bytes, or None. On CPU it simulates a device of that
      size (the model's parameters count); on CUDA leave it None: the card
      is the limit.
    - coupled: "error" (default) refuses to split a model with BatchNorm in
      training mode, naming the layers, or a loss that mixes the batch's
      samples before it reduces them (an in-batch contrastive loss, checked
      once on the first split micro-batch, Note [Probing how the loss
      reduces]), or a forward that mixes them (a mean or attention over the
      batch's dimension, checked then with the step run again on a few
      samples in the modules' own modes, Note [A forward that mixes the
      samples]; where no 2 samples fit, the step's notes say it was not
      checked, Note [A check with no room]); "allow" splits
      anyway (each micro-batch uses its own statistics, its loss its own
      samples).
    - reduction: None (default) or "mean"/"sum". Each micro-batch's loss is
      weighted by how the loss reduces the batch, found by watching it run
      (Note [Probing how the loss reduces], loss_weighting.py): a torch loss
      function's or .mean()/.sum()'s own reduction, with cross_entropy and
      nll_loss weighted by counted targets (ignore_index, class weights), as
      memfit.lazy does, and a mean over tokens ((l * mask).sum() /
      mask.sum(), l[mask].mean()) by each micro-batch's tokens (Note [A sum
      over a count]); a loss made otherwise is probed by its values once,
      and refused when it is neither a mean nor a sum. reduction= says it
      for such losses, checked by the same values where they can run; one
      contradicting the loss's own, or its values, is refused. A loss
      weighed by samples that adds a term counted otherwise (two heads'
      cross_entropy with ignored targets, cross_entropy + an L2 of the
      weights) is refused where a micro-batch's counts show it (Note [A
      term that counts the batch otherwise]).
    - Dropout draws its masks per micro-batch: a split step of a model with
      dropout in training mode is a valid step but not the eager step on the
      whole batch, and its report's notes say so (Note [Dropout in a split
      step], step_notes.py).
      A step function's or a model's own loss is watched the same way.
    - step: the user's own step, step(model, batch) -> loss, instead of
      loss_fn and a target: each micro-batch is a slice of the batch along
      batch_dim, of the kind given (tensor, tuple, dict, BatchEncoding); the
      Trainer weights the loss it returns and runs backward (Note [The step
      function's contract], user_step.py). A Hugging Face model with labels
      in its batch needs neither.
    - split=False runs the batch whole and lets an OOM out.
    - scaler: a torch.amp.GradScaler for mixed precision. Autocast stays
      yours (wrap step() in torch.autocast); each micro-batch's loss is
      scaled for its backward (scaler.scale), then scaler.step(optimizer) and
      scaler.update() run once for the whole batch: the recipe of PyTorch's
      AMP tutorial, with the same gradients. report.loss stays unscaled.

    The batch may stay on the host (CPU memory beside a GPU; on the
    simulated device, tensors made under memfit.host_memory()): each
    micro-batch is moved to the model's device as it runs, pinned and with
    non_blocking copies on CUDA, so only one micro-batch of data takes
    device memory. An OOM names the phase and what fills the memory (the
    batch's own data among it) with advice for that cause.

    A micro-batch that runs out of memory leaves no trace: its gradients are
    not kept (see Note [Why a retried micro-batch never counts twice],
    trainer.cpp), and the buffers its forward wrote (BatchNorm's running
    statistics) and the RNG it drew from are put back before it is redone;
    a step that raises puts them back as they were before it. See Note
    [Buffers of a failed micro-batch] (step_guard.py). A split step whose
    forward wrote buffers, or drew random numbers, says so in its notes.

    The parameters that train and the BatchNorm layers in training mode are
    read at each step: freezing a layer or putting it in eval mode after
    the Trainer was made counts. A forward that writes into its inputs in
    place (x.mul_(2)) changes each sample once, as one eager step would; a
    micro-batch that ran out of memory after such a write is not redone
    (the write would count twice): step() raises ValueError saying so.

    A DistributedDataParallel model runs distributed: each rank splits its own
    batch, the ranks agree on the micro-batch to start from, and the gradients
    are synced once, before the optimizer step: the mean of the ranks'
    local-batch gradients, as DDP computes. step() then returns a
    DistributedStepReport (rank, world_size, local_batches, global_batch,
    start_micro_batch), and a failed collective or rank raises
    memfit.DistributedError. See Note [Micro-batches under
    DistributedDataParallel] (distributed.py).

    Variable-length data (seq_dim=, the inputs' length dimension, with
    lengths=): each step's micro-batch comes from the batch's padded length
    L, not from the first batch's: the batch runs whole where it fits at L,
    else cut evenly into micro-batches that do (see Note [A micro-batch per
    length]). lengths: the lengths to fit, [128, 512, 2048] (measured
    before the first step as the Trainer splits a batch, the gradients
    accumulated: find_batch_size(..., seq_dim=, lengths=,
    set_to_none=False)), or a LengthFit, or the LengthBatchSampler that
    batches the data (its fit). trainer.length_fit is the fit used.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 loss_fn: LossFn | None = None, budget: Size | None = None, batch_dim: int = 0,
                 target_batch_dim: int = 0, coupled: str = "error", reduction: str | None = None,
                 split: bool = True, micro_batch: int = 0, scaler: Any = None,
                 plan: bool = True, step: StepFn | None = None, seq_dim: Any = None,
                 lengths: Any = None) -> None:
        if coupled not in ("error", "allow"):
            raise ValueError(f"[Trainer] coupled must be 'error' or 'allow', got {coupled!r}")
        plan = flag(plan, "Trainer", "plan")
        split = flag(split, "Trainer", "split")
        _check_scaler(scaler)
        optimizer = unwrapped_optimizer(optimizer)  # a list of optimizers: one
        check_optimizer(model, optimizer, "Trainer", instance_only=True)
        _check_not_meta(model)
        # Checked now, not at the first step: see user_step.as_user_step.
        how = as_user_step(loss_fn, step, "Trainer", model)
        self._how = dataclasses.replace(how, what="Trainer.step")
        micro_batch = count(micro_batch, "Trainer", "micro_batch", minimum=0)
        # See Note [The first micro-batch from the fit].
        self._plan = plan and split and micro_batch == 0
        self.planned = None  # a MicroBatchPlan once one was made
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.scaler = scaler
        self.batch_dim = batch_dim
        self.target_batch_dim = target_batch_dim
        budget = None if budget is None else to_bytes(budget, "Trainer")
        self._dist = DistributedStep(model) if is_distributed(model) else None
        self._module = model.module if self._dist else model
        # See Note [Probing how the loss reduces] (loss_weighting.py): the
        # chunks come weighted, the native step adds them as they are.
        self._weighting = LossWeighting(loss_fn, reduction, coupled == "allow")
        opt_step = _current_step(optimizer) if scaler is None else _scaled_step(optimizer, scaler)
        # The batch's count is this rank's: its gradients are divided by it
        # before the ranks' are averaged, as DDP averages each rank's mean.
        opt_step = _weighted_step(self._dist.optimizer_step(opt_step) if self._dist else opt_step,
                                  optimizer, self._weighting)
        self._options = (
            opt_step,
            split,
            coupled == "allow",
            False,
        )
        self._shape = None
        self._native_now(budget, micro_batch)
        self.seq_dim, self.length_fit, self._fit_lengths = _length_options(seq_dim, lengths)

    def _native_now(self, budget=None, micro_batch=0):
        """The native Trainer over the parameters that train now and the
        layers that mix samples now; rebuilt, keeping its budget and
        micro-batch, when either changed since the last step."""
        # The optimizer's other parameters too (a loss head it trains): the
        # step frees their .grad as the user's optimizer.zero_grad() does.
        params = [p for p in step_parameters(self.model, self.optimizer) if p.requires_grad]
        layers = coupled_layers(self._module)
        shape = ([id(p) for p in params], layers)
        if shape != self._shape:
            if self._shape is not None:
                budget, micro_batch = self._native.budget, self._native.micro_batch
            step, split, allow, mean = self._options
            options = _memfit.TrainerOptions(
                budget=budget, split=split, coupled="allow" if allow else "error",
                mean_loss=mean, micro_batch=micro_batch)
            self._native = _memfit.Trainer(params, step, options=options, coupled_layers=layers)
            self._shape = shape
        return self._native

    @property
    def micro_batch(self) -> int:
        """The micro-batch size the next step starts from (0: whole batch)."""
        return self._native.micro_batch

    def set_budget(self, budget: Size | None) -> None:
        """Change the budget (bytes, "8GiB", or None) for the next steps; the
        next step plans its micro-batch again (Note [The first micro-batch
        from the fit])."""
        self._native.set_budget(None if budget is None else to_bytes(budget, "Trainer"))
        self.planned = None

    def step(self, inputs: Batch, target: Batch = None) -> Any:
        """One optimizer step on the whole batch; returns a StepReport with
        batch, micro_batch, micro_batches, ooms_recovered, samples, loss,
        peak_bytes, chunks and notes (what differs from one eager step on
        the whole batch: dropout's masks)."""
        native = self._native_now()
        if self._dist is not None:
            return self._distributed_step(native, inputs, target)
        # The native step sets the parameters' gradients to None before and
        # after (see Note [The order of a training iteration]).
        n = self._batch(inputs, target)
        self._how.check_batch(self._module, inputs, target)  # before any plan or probe
        if self.seq_dim is not None:
            self._length_micro_batch(native, inputs, target, n)
        elif self._wants_plan(native, target, n):
            self._plan_micro_batch(native, inputs, target, n)
        return self._redone_after_hook_oom(native, inputs, target, n)

    def _redone_after_hook_oom(self, native, inputs, target, n):
        """The native step of the whole batch, run again from its start in
        micro-batches half as large where it ran out of memory inside a
        Python hook of the backward: See Note [Out of memory inside the
        backward's Python code]."""
        users = tensors_in(inputs) + tensors_in(target)
        redone = []
        while True:
            versions = [t._version for t in users]
            tried = native.micro_batch or n
            try:
                report = self._weighted_step(target, lambda loss_of: native.step(
                    n, loss_of(inputs, target, n), self._batch_bytes(inputs, target)))
            except RuntimeError as e:
                oom = e.__cause__
                if not isinstance(oom, torch.cuda.OutOfMemoryError) or \
                        isinstance(e, torch.cuda.OutOfMemoryError) or tried <= 1 or \
                        any(t._version != v for t, v in zip(users, versions)):
                    raise
                # The error's frames hold the failed attempt's tensors, on the
                # device: dropped before the step runs again, not at a gc.
                traceback.clear_frames(oom.__traceback__)
                traceback.clear_frames(e.__traceback__)
                oom = None
                smaller = max(1, min(tried, native.micro_batch or n) // 2)
                redone.append(smaller)
                native.set_micro_batch(smaller)
                continue
            if redone:
                report.notes = list(report.notes) + [
                    f"the backward's Python code (activation checkpointing's recompute, a "
                    f"custom autograd.Function) ran out of memory {len(redone)} time(s): the "
                    f"step ran again from its start in micro-batches of {redone[-1]}; "
                    f"ooms_recovered does not count these"]
            return report

    def _can_plan(self, n):
        """Whether this batch can be planned at all: see Note [The first
        micro-batch from the fit] for when it cannot."""
        return n >= 2 and not (coupled_layers(self._module) and not self._options[2])

    def _wants_plan(self, native, target, n):
        """Whether this step plans its micro-batch first."""
        if not self._plan or not self._can_plan(n):
            return False
        if self.planned is not None:
            # Planned: again only for a larger batch than the one that ran whole.
            return native.micro_batch == 0 and n > self.planned.batch
        return self._room() is not None

    def _room(self):
        """(bytes the step may take, whether a step measured here verifies
        it), or None without a budget."""
        device = self._device()
        if device.type not in ("cpu", "cuda") or (
                device.type == "cpu" and self._native.budget is None
                and _memfit.budget("cpu") is None):
            return None
        try:
            room = self._resolved_budget(device).room_bytes
        except DeviceFull:
            room = 0
        return room, device.type == "cpu"

    def _resolved_budget(self, device):
        # The rehearsal counts its own copy of every weight, .grad and state
        # tensor: See Note [The budget is the whole device] (plan/budget.py).
        return resolve_budget(self._native.budget, with_loss_module(self._module, self._how),
                              self._measured_optimizer(),
                              "Trainer.step", device.type, simulates=device.type == "cpu")

    def _measured_optimizer(self):
        # The plan's steps take no collective: See Note [ZeroRedundancyOptimizer
        # measured on this rank's shard] (plan/ranks.py).
        return rank_local_optimizer(self.optimizer, "Trainer.step")

    def _plan_micro_batch(self, native, inputs, target, n):
        """Sets the micro-batch the step starts from, measured: see Note [The
        first micro-batch from the fit]."""
        where = self._room()  # once: every question against the same room
        self.planned = MicroBatchPlan(batch=n, room_bytes=where[0])
        try:
            self.planned = self._measure_plan(inputs, target, n, where)
        except StepError:
            raise  # the step itself would fail the same way
        except (ValueError, RuntimeError) as e:  # DoesNotFit is a ValueError
            self.planned.failed = _failure(e)
            # The step still runs (halving at each OOM): say why it was not planned.
            warnings.warn(f"[Trainer.step] the micro-batch for {n} samples was not planned "
                          f"({self.planned.failed}); the step starts from the whole batch and "
                          "halves it at each out-of-memory error", RuntimeWarning, stacklevel=3)
            return
        native.set_micro_batch(self.planned.micro_batch)

    def _fitter(self, inputs, target, n, room, on_device):
        """fit(set_to_none, max_batch) -> the BatchFit of this step in `room`
        bytes (self._room()), measured where the model is (a card, or the
        simulated device: on_device) and verified there at the split's
        answer (the whole batch's step is its own check)."""
        k = min(n, 2)
        example = narrow_batch(inputs, 0, k, self.batch_dim)
        example_target = None if target is None else map_tensors(
            target, lambda t: t.narrow(self.target_batch_dim, 0, k))
        # Beside a card (not the simulated device) the steps are held against
        # the caching allocator's reserved bytes, workspace included.
        card = "cpu" if on_device else "cuda"

        def fit(set_to_none, max_batch):
            def record():
                return profile(self._module, example, example_target, loss_fn=self._how,
                               optimizer=self._measured_optimizer(), batch_dim=self.batch_dim,
                               set_to_none=set_to_none, target_device=card,
                               train_mode=False,  # the Trainer runs the model's modes as they are
                               keep_output=False,  # its micro-batch drops it: _chunk_loss
                               target_batch_dim=self.target_batch_dim)

            # The room as the device is after a step: See Note [What a step
            # leaves on the device] (plan/fit.py).
            def room_now():
                return self._resolved_budget(self._device())

            after, report = fitting.settled_example(room_now, record, self._module)
            verify = not set_to_none  # the whole batch: the step is the check
            return fitting.settled_search(room_now, after, self._module, lambda r: fitting.search(
                report, min(room, r.room_bytes), 0, verify=verify, max_batch=max_batch,
                who="Trainer"), record)

        return fit

    def _measure_plan(self, inputs, target, n, where):
        """The MicroBatchPlan of this batch in `where` (self._room(): the
        room, whether a step here verifies), the two questions of Note [The
        first micro-batch from the fit]; raises what the measurement raised."""
        room, on_device = where
        if room == 0:  # a full device: DeviceFull's own line, naming what fills it
            self._resolved_budget(self._device())
        fit = self._fitter(inputs, target, n, room, on_device)
        plan = MicroBatchPlan(batch=n, room_bytes=room)
        plan.whole = fit(True, n)
        plan.max_batch = plan.whole.max_batch
        if plan.max_batch < n:
            plan.split = fit(False, n)
            plan.max_batch = plan.split.max_batch
        return plan.cut()

    def _length_micro_batch(self, native, inputs, target, n):
        """Sets the micro-batch for this batch's padded length: See Note [A
        micro-batch per length]."""
        length = sequence_length(inputs, self.seq_dim, "Trainer.step")
        if self.length_fit is None:
            self.length_fit = self._fit_per_length(inputs, target)
        try:
            cap = self.length_fit.at(length)
        except ValueError as e:
            raise ValueError(f"[Trainer.step] a batch {length} long: {e}") from None
        micro = 0 if n <= cap else even_micro_batch(n, max(1, cap))
        self.planned = MicroBatchPlan(batch=n, micro_batch=micro)
        native.set_micro_batch(micro)

    def _fit_per_length(self, inputs, target):
        """find_batch_size at each of lengths=, measured as a split step runs
        (the gradients of the micro-batches before alive)."""
        k = min(2, batch_size(inputs, self.batch_dim, "Trainer.step"))
        example = narrow_batch(inputs, 0, k, self.batch_dim)
        example_target = None if target is None else map_tensors(
            target, lambda t: t.narrow(self.target_batch_dim, 0, k))
        return fitting.find_batch_size(
            self._module, example, example_target, loss_fn=self._how,
            optimizer=self.optimizer, budget=self._native.budget, batch_dim=self.batch_dim,
            set_to_none=False, train_mode=False, keep_output=False, seq_dim=self.seq_dim,
            lengths=self._fit_lengths, target_batch_dim=self.target_batch_dim)

    def _batch(self, inputs, target):
        n = batch_size(inputs, self.batch_dim, "Trainer.step")
        if target is not None:
            nt = batch_size(target, self.target_batch_dim, "Trainer.step target")
            if nt != n:
                raise ValueError(
                    f"[Trainer.step] inputs hold {n} samples but the target holds "
                    f"{nt}: they must hold the same samples"
                )
        return n

    def _device(self):
        p = next(self._module.parameters(), None)
        return torch.device("cpu") if p is None else p.device

    def _simulated(self):
        return self._native.budget is not None or _memfit.budget("cpu") is not None

    def _on_host(self, t, device):
        """Whether `t` lives on the host, not on the model's device: CPU
        beside a GPU, or memfit.host_memory() (untracked) beside the
        simulated device."""
        if t.device != device:
            return True
        return device.type == "cpu" and self._simulated() and _memfit.allocation_id(t) is None

    def _batch_bytes(self, inputs, target):
        """Bytes of the batch's own data that sit on the device for the step."""
        device = self._device()
        storages = {}
        for t in tensors_in(inputs) + tensors_in(target):
            if not self._on_host(t, device):
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return sum(storages.values())

    def _mover(self):
        """fn(micro-batch tensor) -> the tensor on the model's device: a batch
        kept on the host is moved one micro-batch at a time, as it runs
        (pinned and non_blocking into CUDA)."""
        device = self._device()
        simulated = device.type == "cpu" and self._simulated()

        def move(t):
            if t.device == device:
                # Host memory beside the simulated device: the copy is what
                # the device holds.
                if simulated and _memfit.allocation_id(t) is None:
                    return t.clone()
                return t
            if device.type == "cuda" and t.device.type == "cpu":
                if not t.is_pinned():
                    t = t.pin_memory()
                return t.to(device, non_blocking=True)
            return t.to(device)

        return move

    def _rerun(self, inputs, target, batch, move):
        """The step run again on samples [a, b) of the batch, copies of them
        on the device (a forward that writes into its inputs writes into the
        copies): how the loss's weighting checks it where a micro-batch's
        own output cannot tell (See Note [Probing how the loss reduces])."""
        model, how, bd, tbd = self._module, self._how, self.batch_dim, self.target_batch_dim

        def copy(t):
            return move(t).clone()

        def run(a, b):
            x = map_tensors(narrow_batch(inputs, a, b - a, bd), copy)
            y = None if target is None else map_tensors(
                target, lambda t: copy(t.narrow(tbd, a, b - a)))
            return how.run(model, x, y)

        return StepRerun(model, run, batch)

    def _chunk_loss(self, inputs, target, batch, guard=None):
        model, how, bd, tbd = self._module, self._how, self.batch_dim, self.target_batch_dim
        # A step function's or the model's own loss is computed inside the
        # forward: the weighting watches the forward too (its reductions).
        own_loss = how.step is not None or (how.loss_fn is None and is_hf_model(model))
        scaler = self.scaler
        weighting = self._weighting
        move = self._mover()
        # The micro-batches are views of the user's tensors: a forward that
        # writes into them changes each sample once, as an eager step would.
        # A micro-batch is only ever asked for twice when it is redone after
        # an OOM: if the failed attempt wrote into it (the tensors' version
        # counters moved), the redo would write twice, so it is refused.
        users = tensors_in(inputs) + tensors_in(target)
        written = []  # [start, end) of the micro-batches whose forward wrote
        again = self._rerun(inputs, target, batch, move)

        def chunk_loss(start, n):
            for a, b in written:
                if a < start + n and start < b:
                    raise ValueError(
                        f"[Trainer.step] samples {a}..{b - 1} ran out of memory after the "
                        f"forward or loss wrote into them in place (their tensors' version "
                        f"changed); redoing them would apply that write twice. Write out of "
                        f"place (x = x * 2, not x.mul_(2)), or pass a micro_batch= that fits"
                    )
            if guard is not None:
                guard.before_attempt(start)
            versions = [t._version for t in users]
            moved = []  # (the user's view, its copy on the device, its version)

            def to_device(t):
                m = move(t)
                if m is not t:
                    moved.append((t, m, m._version))
                return m

            try:
                x = map_tensors(narrow_batch(inputs, start, n, bd), to_device)
                y = None if target is None else map_tensors(
                    target, lambda t: to_device(t.narrow(tbd, start, n)))
                if own_loss:
                    grads = _grad_slots(model)
                    loss = weighting.chunk_loss(lambda: (how.run(model, x, y), None),
                                                start, n, batch, y, tbd, rerun=again)
                    _check_grads_kept(grads, _grad_slots(model))
                else:
                    out = how.forward(model, x)
                    loss = weighting.chunk_loss(lambda: (how.loss(out, y), out),
                                                start, n, batch, y, tbd, rerun=again)
                    out = None
            finally:
                # A write into a micro-batch's copy goes back into the user's
                # samples, where an eager step on these tensors would leave it.
                with torch.no_grad():
                    for view, m, version in moved:
                        if m._version != version:
                            view.copy_(m)
                if any(t._version != v for t, v in zip(users, versions)):
                    written.append((start, start + n))
            check_loss_trains(loss, model, "Trainer.step")
            if scaler is not None and scaler.is_enabled():
                # The backward sees scaler.scale(loss); the value (report.loss)
                # stays the loss itself.
                scaled = scaler.scale(loss)
                loss = loss.detach() + (scaled - scaled.detach())
            return loss

        return chunk_loss

    def _distributed_step(self, native, inputs, target):
        try:
            n = self._batch(inputs, target)
            self._how.check_batch(self._module, inputs, target)  # before any plan or probe
        except ValueError as e:
            n = e  # the other ranks must hear of it, not wait for this rank
        plan = None if isinstance(n, Exception) else RankPlan(
            wanted=self.seq_dim is None and self._wants_plan(native, target, n),
            run=lambda batches: self._agreed_plan(native, inputs, target, n, batches))
        return self._weighted_step(target, lambda loss_of: self._dist.step(
            native, n, batch_signature(inputs, target), loss_of(inputs, target, n), plan))

    def _agreed_plan(self, native, inputs, target, n, batches):
        """Sets the micro-batch every rank agreed on: See Note [One
        micro-batch on every rank]. Every rank calls it together."""

        def answer():
            where = self._room()
            measured = self.seq_dim is None and self._plan and self._can_plan(n) \
                and where is not None
            # Nothing to measure here: this rank's own micro-batch, or no limit.
            mine = (self._measure_plan(inputs, target, n, where) if measured
                    else MicroBatchPlan(batch=n, max_batch=native.micro_batch or n))
            if mine.max_batch >= n:  # the batch fits whole here: no limit on the others
                mine.max_batch = max(batches)

            def capped(m):  # this device's own truth at the ranks' micro-batch
                if m >= n or not measured:
                    return dataclasses.replace(mine, max_batch=m)
                split = self._fitter(inputs, target, n, *where)(False, m)
                return dataclasses.replace(mine, split=split, max_batch=split.max_batch)

            return LocalAnswer(mine, capped)

        self.planned = agree(answer, self._dist.group, "Trainer.step").cut()
        native.set_micro_batch(self.planned.micro_batch)

    def _weighted_step(self, target, run):
        """run(loss_of) -> the native StepReport, where loss_of(inputs,
        target, n) gives the micro-batches' loss callback: the step with the
        loss weighting around it (Note [Probing how the loss reduces]), the
        buffers and RNG restored if it fails (and the optimizer state it
        made), and the notes of a split step."""
        guard = StepGuard(self._module)
        # A parameter's state is made by its first optimizer step (Adam's
        # exp_avg, then exp_avg_sq): a step that fails between them left
        # half of it, and the next step raised KeyError. Made by a failed
        # step, it goes with it.
        stateless = [p for group in self.optimizer.param_groups for p in group["params"]
                     if not self.optimizer.state.get(p)]
        writes = InPlaceWrites(self.optimizer)
        self._weighting.begin_step(target)
        try:
            report = run(lambda x, y, n: self._chunk_loss(x, y, n, guard))
        except BaseException as e:
            guard.restore_before_step()
            for p in stateless:
                self.optimizer.state.pop(p, None)
            self._weighting.finish_step()
            _say_written(e, writes.line())
            raise
        scale = self._weighting.finish_step()
        if scale is not None:
            report.loss *= scale
        split = report.micro_batches > 1
        report.notes = split_notes(
            self._module, report.micro_batches, drew_random=split and guard.drew_random(),
            written=guard.written_buffers(skip=[m for _, m in batchnorms(self._module)])
            if split else ())
        unchecked = self._weighting.unchecked_note() if split else ""
        if unchecked:
            report.notes = list(report.notes) + [unchecked]
        return report
