"""How the Trainer weights each micro-batch's loss: the rule of
_step/loss_rule.py (memfit.lazy's too), found by watching the loss function
run (see Note [Probing how the loss reduces])."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode

from .._step.loss_rule import LossRule, bind_arguments, counted_targets, loss_rule
from .._step.user_state import kept_rng
from .step_notes import random_modules

__all__: list = []

# Note [Probing how the loss reduces]
# A micro-batch's loss counts in the batch's by how the loss reduces the
# batch (Note [How a chunk's loss counts in the batch's]). The Trainer does
# not guess it from loss_fn.reduction, which a lambda or a function does
# not have: it watches the loss function run on each micro-batch of a split
# step, under a TorchFunctionMode that sees its torch calls (the model's
# forward runs outside it, at no cost). When the loss returned is the
# result of one torch loss function (F.cross_entropy, nn.MSELoss, ...) or
# of a full .mean()/.sum(), that call's reduction is the rule: a sum weighs
# 1, a mean c_i/B, cross_entropy/nll_loss with class indices the chunk's
# share of the counted targets (ignore_index, class weights). For those two
# the mode computes the chunk's mean as sum/count (0, not NaN, for a chunk
# whose targets are all ignored). When the loss is given the step's target
# (a slice of it), the batch's count is counted from the whole target first
# and the chunk weighs count/that. When it derives its targets (labels
# shifted by one), the Trainer backpropagates the chunk's sum (mean x
# count) and divides the accumulated gradients and the loss by the batch's
# count before the optimizer step. Both are exact whatever the chunks are,
# also when an OOM redoes one smaller.
#
# A loss made otherwise (ce + 0.1 * l2, 0.5 * x.pow(2).mean()) is probed by
# its values once: the loss of up to 8 samples together against each alone,
# on the first split micro-batch's output; their mean or their sum, to the
# rounding of the loss's dtype, is the rule. Neither (or both: a zero loss)
# is refused, asking for reduction=. A loss nonlinear in its per-sample
# terms can pass for a mean only where those terms are alike to rounding. A reduction=
# given is used for such losses; one that contradicts what the loss does
# (reduction="sum" with nn.CrossEntropyLoss()) is refused. A step that
# runs whole weighs its loss 1 whatever the rule, so nothing is probed.
#
# A loss whose rule is known can still mix the samples before it reduces
# them: an in-batch contrastive loss (cross_entropy over z @ z.T), a batch
# statistic (o.std(0)). Split, each micro-batch's loss sees only its own
# samples: the gradients are not the whole batch's (off by 75% for the
# contrastive loss), and nothing said so. So the first split step checks
# it once, on the first micro-batch's output: the loss of up to 8 samples
# together against each alone, combined by the rule (their mean, their sum,
# or for cross_entropy/nll_loss each weighted by its counted targets), to
# 64 k ulps of the loss's dtype. A loss that fails it is refused as
# BatchNorm is, naming coupled="allow" (each micro-batch's loss over its
# own samples). An output that is not one tensor of the batch's samples, or
# a loss that cannot run on them without grad, is not checked. The check's
# calls of loss_fn run without grad and put the RNG back; a loss that counts
# its calls sees them.
#
# A loss made inside the forward (a step function, a Hugging Face model's
# own loss) has no output to cut, nor has a micro-batch of one sample:
# there the check and the probe run the step itself again, forward and
# loss, on up to 8 of the batch's samples together and each alone
# (StepRerun), on copies of them, without grad, in eval mode (dropout would
# draw other masks for other batches), the RNG and every buffer put back
# (a queue of negatives the forward writes). The model runs at other batch
# sizes there, and its kernels round otherwise (bf16 under autocast), so
# the agreement asked is 1% of the loss; where the device has no room for
# those samples the check is not run (the probe asks for reduction=, one
# line). Without it a CLIP-style step split into micro-batches of 8 trained
# on gradients 90% off the whole batch's, and a contrastive loss_fn in
# micro-batches of 1 on gradients 1.27 off (each sample's loss alone is 0),
# and nothing said so.
#
# Note [A forward that mixes the samples only in training mode]
# The step run again in eval mode misses a layer that mixes the samples in
# training mode only: a custom batch norm (F.batch_norm(training=
# self.training)), a centring over the batch's dimension where
# self.training. Its split step trained on gradients 0.08-0.11 relative
# off the whole batch's, and nothing said so (the rows passed, and the
# rerun in eval mode did not mix them). So the checks that run the step
# again (StepRerun) run it first with the modules in their own modes,
# dropout's in eval mode (its masks would differ per batch), each run on
# fresh copies of the buffers, swapped in (a write reaches neither the next
# run nor the tensors the step's own forward saved for its backward). Where
# those runs drew random numbers (F.dropout in a forward, noise) their
# values tell nothing, and where they wrote a buffer the step's notes name
# it (Note [What else a split step does per micro-batch], step_notes.py,
# as for a batch norm of its own): both are checked in eval mode as
# before.
#
# Note [A check with no room]
# The checks that run the step again (StepRerun) take up to 8 samples
# together beside the micro-batch whose forward is alive: under the budget
# that split the batch they may not fit (a language model's logits of 8
# samples, where the micro-batch is 2), and the check was skipped, the
# split step trained as if the samples stood apart, and nothing said so. So
# the check runs again on half as many samples, down to 2 (two samples
# together against each alone show a mixing as well, less surely); where
# even 2 do not fit, each split step's notes say the check did not run and
# what to do (unchecked_note()).
#
# Note [How close a step run again agrees]
# The model runs at other batch sizes there, and its kernels round
# otherwise: the agreement asked follows the precision it computes in, 1% of
# the loss under autocast or with half-precision weights, 1e-3 in float32 on
# a card (TF32), 1e-4 in float32 on the CPU, 1e-9 in float64. Asked 1% in
# every precision, a loss_fn adding a mixture-of-experts balance term (the
# batch's mean routing, squared) to cross_entropy passed for a mean on the
# model's output tuple, 0.3-0.9% off the samples' mean loss, and its split
# steps trained on gradients 11-14% off the whole batch's, silently.

# Note [A declared reduction is checked]
# reduction= was trusted for a loss the mode could not read: a loss adding
# a token mean (cross_entropy with ignored padding) to a sample mean, which
# the probe refused as neither, asking for reduction=; given "mean", its
# split step trained on gradients 0.65 relative off the whole batch's,
# silently. So a declared reduction is checked by the same values on the
# first split step, and refused where they show another (neither, or the
# other); where they cannot run, or show both (a zero loss), it is used as
# declared. coupled="allow" skips the check, as it does the others.

# Note [A sum over a count]
# A language model's loss is often averaged over the batch's tokens, not
# its samples: (loss * mask).sum() / mask.sum(), or loss[mask].mean(). Each
# sample owns another number of tokens, so a micro-batch's share of the
# batch's loss is its tokens' share, not its samples': weighted by samples
# the split step's gradients were 0.65 relative off the whole batch's (and
# with reduction="mean", which the probe's refusal asked for, silently). So
# the mode also sees a division of a full sum by a count, a full sum made
# without grad (a clamp of it too), as rule "tokens" with that count, and
# counts a full .mean()'s elements. A chunk's loss is then backpropagated as
# its sum (loss x count) and the accumulated gradients divided by the
# batch's count, as for derived targets. For a .mean() the first split
# step's check decides: where up to 8 samples together hold their elements
# alone added up, the mean is over elements each sample owns and weighs by
# them (the same as by samples where each holds as many, and exact where
# the first 8 do and later ones do not); where the mean is over a dimension
# the samples share (a seq-first loss's per-position means), or the check
# did not run, it weighs by samples. A count the samples do not own (a
# constant) is refused. A chunk that counts nothing (every token masked)
# adds 0, not 0/0. The count may be cast (.float(), .to()), the sum be over
# every dimension named (a vector's sum(0)) or a sum of full sums (two
# heads' reduction="sum" losses): seen only as a full .sum() over a bare
# count, the rest were weighed by samples, 0.14-0.50 relative off the whole
# batch's where the first samples held as many tokens each.

# Note [A reduction over the batch's dimension]
# The mode sees full reductions only: l.mean(0).sum() (a per-output mean
# over the samples, summed) showed as a sum and l.sum(0).mean() as a mean,
# the opposite of how each reduces the samples, and the first split step's
# check refused them as mixing the samples, naming coupled="allow", which
# then weighted them by the wrong rule (gradients 3x the batch's in 3
# micro-batches), silently. Where the check's values are the other
# reduction of the samples alone, to the same agreement, that one is the
# rule, as the probe by values would answer for a loss the mode cannot read.

# Note [A forward that mixes the samples]
# The check on the output's rows sees the loss only: a model whose forward
# mixes the samples (a layer centring over the batch's dimension, attention
# across it, routing with a capacity per batch) gives rows that each depend
# on the others, and the loss of those rows together is their losses alone
# combined; split, it trained on gradients 0.94-1.26 relative off the whole
# batch's, and nothing said so. So where the rows pass, the same check runs
# on the step run again (StepRerun: the forward and the loss, on up to 8 of
# the batch's samples together and each alone, in eval mode, without grad,
# the RNG and buffers put back), at its agreement (Note [How close a step
# run again agrees]). Once per Trainer, on its first split step; not under
# coupled="allow", nor where the device has no room for those samples.

# Note [The scale of a chunk's sum]
# A chunk backpropagated as its sum (loss x count) seeds its backward with
# gradients count times the batch mean's: under fp16 autocast and a
# GradScaler (2**16) a causal LM's shifted-label loss overflowed to inf in
# the micro-batches where the whole batch's did not, and every split step
# was skipped, its scale halved, silently. So the sum is divided by a unit,
# the batch's count as the step's first counting chunk extrapolates it
# (count x batch / n), rounded to a power of two: the seeds are about the
# whole batch's, and dividing by the unit (and multiplying it back in
# grad_scale()) is exact, so the gradients are the same bits as without it.

# Note [A term that counts the batch otherwise]
# The probe by values (and a .mean() of terms, a sum weighed as a mean by
# Note [A reduction over the batch's dimension]) weighs a chunk by its
# samples, n/B: exact only where every term the loss adds averages over
# something each sample holds as much of. A term that averages over counted
# targets (cross_entropy with ignore_index or class weights) or tokens (a
# sum over mask.sum(), a masked .mean()) is not, and the values of the first
# 8 samples cannot tell where those hold as many each: two cross_entropy
# heads with padding only in later samples trained on gradients 0.50
# relative off the whole batch's, cross_entropy + an L2 of the weights
# 0.14 off, class-weighted heads of sorted data 0.21 off, silently. So where
# a chunk is weighed by its samples, each counted reduction the mode saw
# that feeds the loss must count the chunk as the step's first chunk (or,
# for a cross_entropy of the step's own target, the whole batch) does per
# sample, or count the same whatever the chunk (a .mean() of the weights);
# else the step is refused, naming the term (not where reduction= is
# declared with coupled="allow": the user's word, as Note [A declared
# reduction is checked] has it). The counts compare to 1e-5
# relative: class weights are summed in their dtype (float32 rounds at
# 6e-8 per add, pairwise), and a share off by less moves the gradients by
# less than that.

_REDUCTIONS = {torch.mean: "mean", torch.Tensor.mean: "mean", torch.sum: "sum",
               torch.Tensor.sum: "sum", torch.nansum: "sum", torch.Tensor.nansum: "sum"}
_DIVISIONS = {torch.div, torch.true_divide, torch.Tensor.div, torch.Tensor.true_divide,
              torch.Tensor.__truediv__}
# What a count stays a count through: a clamp, a cast (See Note [A sum over a count]).
_CLAMPS = {torch.clamp, torch.clamp_min, torch.Tensor.clamp, torch.Tensor.clamp_min,
           torch.Tensor.float, torch.Tensor.double, torch.Tensor.to, torch.Tensor.type_as}
_ADDITIONS = {torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__}


def declared_reduction(loss_fn, reduction, who="Trainer"):
    """The reduction the user declared: `reduction` ("mean"/"sum"/None),
    checked against loss_fn.reduction when the loss has one. Raises
    ValueError, one line, for anything else or a contradiction."""
    if reduction is not None and reduction not in ("mean", "sum"):
        raise ValueError(f"[{who}] reduction must be 'mean' or 'sum', got {reduction!r}")
    own = getattr(loss_fn, "reduction", None)
    if own is None:
        return reduction
    if own not in ("mean", "sum", "batchmean"):
        raise ValueError(
            f"[{who}] the loss reduces with {own!r}; memfit weights micro-batches for "
            f"'mean' or 'sum' losses: make the loss reduce to a scalar (reduction='mean')"
        )
    own = "mean" if own == "batchmean" else own
    if reduction is not None and reduction != own:
        raise ValueError(
            f"[{who}] reduction={reduction!r} contradicts the loss's own reduction "
            f"{own!r} ({type(loss_fn).__name__}.reduction): the micro-batches would be "
            f"weighted wrongly; drop reduction= (memfit reads the loss's), or build the loss "
            f"with reduction={reduction!r}"
        )
    return reduction


class _Reductions(TorchFunctionMode):
    """Sees the loss function's torch calls: each loss function and full
    mean/sum, with its LossRule; cross_entropy/nll_loss means computed as
    sum/count (see Note [Probing how the loss reduces])."""

    def __init__(self):
        super().__init__()
        self.calls = []  # (result, LossRule, count or None)
        # id -> (a full sum without grad or a clamp of one, that sum): the
        # counts a loss may divide its sum by (Note [A sum over a count]).
        self._counts = {}
        self._sums = {}  # id -> a sum of full sums (a numerator, not a rule)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = _REDUCTIONS.get(func)
        if kind is not None:
            return self._reduction(func, kind, args, kwargs)
        if func in _CLAMPS and args:
            out = func(*args, **kwargs)
            count = self._count_of(args[0])
            if count is not None:
                self._counts[id(out)] = (out, count)
            return out
        if func in _ADDITIONS and len(args) == 2 and not kwargs:
            out = func(*args)
            if all(self._is_sum(a) for a in args):  # one, to divide by a count
                self._sums[id(out)] = out
            return out
        if func in _DIVISIONS and len(args) == 2 and not kwargs:
            total, by = args
            count = self._count_of(by)
            if count is None or not self._is_sum(total):
                return func(*args)
            # A chunk with nothing to count (every token masked out) counts 0
            # in the batch's: its sum over 1, not 0/0.
            out = func(total, torch.where(by != 0, by, torch.ones_like(by)))
            self.calls.append((out, LossRule("tokens", "a sum over a count"), count))
            return out
        rule = None
        try:
            arguments = bind_arguments(func, args, kwargs)
        except Exception:
            arguments = None
        if arguments is not None:
            target = arguments.get("target")
            rule = loss_rule(func, arguments,
                             target.dtype if isinstance(target, torch.Tensor) else None)
        if rule is None or rule.kind != "classes":
            out = func(*args, **kwargs)
            if rule is not None:
                self.calls.append((out, rule, None))
            return out
        summed = dict(arguments)
        summed["reduction"] = "sum"
        summed.pop("size_average", None)
        summed.pop("reduce", None)
        total = func(**summed)
        count = counted_targets(rule.target, rule.weight, rule.ignore_index).to(total.dtype)
        out = total / torch.where(count > 0, count, torch.ones_like(count))
        self.calls.append((out, rule, count))
        return out

    def _reduction(self, func, kind, args, kwargs):
        """A mean or sum; a full one is recorded: a mean with its elements
        as its count (Note [A sum over a count]), a sum without grad as a
        count a loss may divide by."""
        full = len(args) == 1 and not (set(kwargs) - {"dtype"})
        if full and kind == "mean" and args[0].numel() == 0:
            # A chunk with no elements to average (every token masked out)
            # counts 0 in the batch's mean: its sum, not NaN.
            out = torch.sum(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        # Over every dimension named one by one (a vector's sum(0)): full too.
        full = full or (isinstance(out, torch.Tensor) and out.dim() == 0
                        and isinstance(args[0], torch.Tensor) and args[0].dim() > 0)
        if not full:
            return out
        count = float(args[0].numel()) if kind == "mean" else None
        self.calls.append((out, LossRule(kind, f"Tensor.{kind}"), count))
        if kind == "sum" and isinstance(out, torch.Tensor) and not out.requires_grad:
            self._counts[id(out)] = (out, out)
        return out

    def _is_sum(self, t):
        """Whether `t` is a full sum, or a sum of them, the mode saw."""
        return self._sums.get(id(t)) is t or any(
            o is t and r.kind == "sum" for o, r, _ in self.calls)

    def _count_of(self, t):
        entry = self._counts.get(id(t))
        return entry[1] if entry is not None and entry[0] is t else None


def _step_tolerance(module):
    """The agreement asked of a step run again: See Note [How close a step
    run again agrees]."""
    dtypes = {p.dtype for p in module.parameters() if p.is_floating_point()}
    low = any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda")) or \
        bool(dtypes & {torch.float16, torch.bfloat16})
    if low or not dtypes:
        return 0.01
    if torch.float32 in dtypes:
        # TF32 convolutions and matmuls round at 2**-10 on a card.
        return 1e-3 if any(p.is_cuda for p in module.parameters()) else 1e-4
    return 1e-9


@dataclasses.dataclass(frozen=True)
class StepRerun:
    """The step run again, forward and loss, on samples [a, b) of the
    batch: run(a, b) -> that loss (See Note [Probing how the loss
    reduces])."""

    module: torch.nn.Module
    run: Callable[[int, int], torch.Tensor]
    samples: int  # the batch's


@dataclasses.dataclass(frozen=True)
class _Probe:
    """value(a, b) -> (the loss of samples [a, b) of k, its counted targets
    or None); tolerance: relative to the losses; rerun: the StepRerun it
    runs, None where it is loss_fn on the output's rows."""

    value: Callable
    k: int
    tolerance: float
    rerun: StepRerun | None = None
    dtypes: set = dataclasses.field(default_factory=set)  # the losses' dtypes, once run

    def agreement(self) -> float:
        """The tolerance, no tighter than the rounding of the losses' own
        dtype summed over k values (up to 1%): a loss cast to float32 from
        a float64 model rounds as float32 (See Note [How close a step run
        again agrees])."""
        own = [64 * self.k * torch.finfo(d).eps for d in self.dtypes if d.is_floating_point]
        return max([self.tolerance] + [min(0.01, t) for t in own])


@contextlib.contextmanager
def _rerun_quietly(rerun, seen=None):
    """A block for the probes' own calls: no grad, the RNG put back, no
    warnings (the std of one sample); for a StepRerun also the model in
    eval mode and its buffers' values and tensors put back. seen: a dict
    that gets "stateful": whether the block drew random numbers or wrote
    a buffer (the reruns' values then differ for that alone)."""
    with torch.no_grad(), kept_rng(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if rerun is None:
            yield
            return
        module = rerun.module
        modes = [(m, m.training) for m in module.modules()]
        buffers = [(m, name, b, b.clone()) for m in module.modules()
                   for name, b in m.named_buffers(recurse=False) if b is not None]
        rng = _rng_now()
        module.eval()
        try:
            yield
        finally:
            for m, training in modes:
                m.training = training
            written = False
            for m, name, b, values in buffers:
                if getattr(m, name, None) is not b:
                    setattr(m, name, b)
                # Only where it changed: a copy into a buffer the step's own
                # forward saved for its backward would fail that backward.
                if not torch.equal(b, values):
                    b.copy_(values)
                    written = True
            if seen is not None:
                seen["stateful"] = written or not _same_states(rng, _rng_now())


def _values_in_room(value, k, rerun, seen):
    """(k, (value(0, k), [value(i, i + 1) for i < k])) run again as
    _check_values does, with k halved down to 2 where the device has no room
    for them: See Note [A check with no room]. Raises the out-of-memory
    error where even 2 samples do not fit, or where there is no StepRerun."""
    while True:
        try:
            found = _values_as_trained(value, k, rerun)
            if found is None:
                seen.clear()
                with _rerun_quietly(rerun, seen):
                    found = value(0, k), [value(i, i + 1) for i in range(k)]
            return k, found
        except torch.cuda.OutOfMemoryError:
            if rerun is None or k <= 2:
                raise
        k //= 2


def _values_as_trained(value, k, rerun):
    """value() of samples [0, k) together and of each alone, the step run
    again with its modules in their own modes (dropout's in eval mode), on
    copies of the buffers made afresh for each run; None where there is no
    StepRerun, nothing in training mode, or the runs drew random numbers or
    wrote a buffer: See Note [A forward that mixes the samples only in
    training mode]."""
    module = None if rerun is None else rerun.module
    if module is None or not any(m.training for m in module.modules()):
        return None
    buffers = [(m, name, b) for m in module.modules()
               for name, b in m.named_buffers(recurse=False) if b is not None]
    modes = [(m, m.training) for m in module.modules()]
    versions = [b._version for _, _, b in buffers]
    with torch.no_grad(), kept_rng(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rng = _rng_now()
        for m in random_modules(module):
            m.training = False

        wrote = []

        def fresh(a, b):
            copies = [buffer.clone() for _, _, buffer in buffers]
            for (m, name, _), c in zip(buffers, copies):
                setattr(m, name, c)
            got = value(a, b)
            wrote.append(any(c._version != 0 or getattr(m, name, None) is not c
                             for (m, name, _), c in zip(buffers, copies)))
            return got

        try:
            found = fresh(0, k), [fresh(i, i + 1) for i in range(k)]
        finally:
            for m, training in modes:
                m.training = training
            for m, name, buffer in buffers:
                setattr(m, name, buffer)
        drew = not _same_states(rng, _rng_now())
    written = any(wrote) or any(b._version != v for (_, _, b), v in zip(buffers, versions))
    return None if drew or written else found


def _rng_now():
    """The CPU generator's state and each initialized CUDA device's."""
    cards = range(torch.cuda.device_count()) if torch.cuda.is_initialized() else ()
    return [torch.get_rng_state()] + [torch.cuda.get_rng_state(d) for d in cards]


def _same_states(a, b):
    return len(a) == len(b) and all(torch.equal(s, t) for s, t in zip(a, b))


class LossWeighting:
    """The rule one Trainer's loss reduces by, and each micro-batch's weight.
    Holds no reference to the Trainer (the native Trainer's optimizer-step
    callback holds this object)."""

    def __init__(self, loss_fn, reduction, coupled_allowed=False):
        self._loss_fn = loss_fn
        self._declared = declared_reduction(loss_fn, reduction)
        self._probed = None  # the numeric probe's answer, "mean" or "sum"
        # Whether the loss was checked to count its samples apart (or
        # coupled="allow" says not to); see Note [Probing how the loss reduces].
        self._separable = coupled_allowed
        # A reduction= declared with coupled="allow": the user's word, unchecked.
        self._as_declared = coupled_allowed and self._declared is not None
        # Whether a .mean()'s chunks weigh by their elements, not their
        # samples; None until checked (Note [A sum over a count]).
        self._by_count = None
        # "mean" or "sum" where the samples' values contradict the reduction
        # the mode saw (See Note [A reduction over the batch's dimension]).
        self._kind = None
        self._checked = False  # whether the first split step's check ran
        # What a check could not run on for lack of room ("the loss", "the
        # model's forward"), or "": See Note [A check with no room].
        self.unchecked = ""
        self._counts = {}  # start -> counted targets of this step's chunk there
        self._sum_chunks = False
        self._unit = None
        self._full_target = None
        self._denominators = {}
        self._shares = {}

    def begin_step(self, full_target=None):
        """Before a step on the batch whose target is `full_target`."""
        self._counts = {}
        self._sum_chunks = False
        self._unit = None  # See Note [The scale of a chunk's sum]
        self._full_target = full_target
        self._denominators = {}  # (ignore_index, id(weight)) -> the batch's count
        # (call index, kind, name) -> (samples, count) it is compared with:
        # See Note [A term that counts the batch otherwise].
        self._shares = {}

    def _batch_count(self, rule):
        """The batch's counted targets for `rule`, from the step's target."""
        key = (rule.ignore_index, id(rule.weight))
        if key not in self._denominators:
            with torch.no_grad():
                self._denominators[key] = float(counted_targets(
                    self._full_target, rule.weight, rule.ignore_index))
        return self._denominators[key]

    def chunk_loss(self, compute, start, n, batch, target, target_dim, rerun=None):
        """The loss of samples [start, start + n) of `batch`, weighted by
        their share of the batch's: compute() returns (the micro-batch's loss
        as the user's loss function makes it, the model's output it took, or
        None where the loss was made inside the forward); `target` is the
        micro-batch's target (a slice of the step's); rerun: a StepRerun of
        the batch, for where the output cannot tell (a loss made inside the
        forward, a micro-batch of one sample)."""
        if n == batch:
            return compute()[0]  # whole: weight 1 whatever the rule
        mode = _Reductions()
        with mode:
            loss, output = compute()
        if isinstance(loss, torch.Tensor) and not loss.requires_grad:
            return loss  # no graph: the caller's check says why, before anything probes it
        found = next(((rule, count) for out, rule, count in mode.calls if out is loss), None)
        if found is None:
            kind = self._probe(output, target, target_dim, rerun)
            if kind == "mean":
                self._check_shares(mode.calls, loss, start, n, batch, target)
            return loss * (n / batch) if kind == "mean" else loss
        rule, count = found
        if not self._separable:
            self._check_separable(output, target, target_dim, rule, rerun)
            self._checked = True
        elif not self._checked and rule.kind in ("mean", "sum"):
            # coupled="allow": nothing refused, but the values still say
            # whether a .mean() weighs by its elements, and the reduction
            # over the batch's dimension (Note [A reduction over the batch's
            # dimension]).
            self._check_separable(output, target, target_dim, rule, rerun, refuse=False)
            self._checked = True
        if self._kind is not None:
            rule = LossRule(self._kind, f"{rule.name} over a reduced batch dimension")
        if self._declared is not None and self._declared != ("sum" if rule.kind == "sum" else
                                                              "mean"):
            raise ValueError(
                f"[Trainer.step] reduction={self._declared!r}, but the loss is "
                f"{rule.name} reducing with {'sum' if rule.kind == 'sum' else 'mean'}: the "
                f"micro-batches would be weighted wrongly; drop reduction= (memfit reads it "
                f"from the loss) or make them agree"
            )
        if rule.kind == "sum":
            return loss
        if rule.kind == "mean" and (not self._by_count or self._kind is not None):
            self._check_shares(mode.calls, loss, start, n, batch, target)
            return loss * (n / batch)
        if rule.kind == "classes" and rule.target is target and \
                isinstance(self._full_target, torch.Tensor):
            # The loss counts the step's own targets: the batch's count is
            # known now, and the chunk weighs count / batch's count.
            return loss * (count / self._batch_count(rule))
        # Targets the loss derived (labels shifted by one): the batch's
        # count is known once every chunk ran; see grad_scale().
        self._sum_chunks = True
        self._counts[start] = (n, count.detach() if isinstance(count, torch.Tensor) else count)
        if self._unit is None and float(count) > 0:
            # See Note [The scale of a chunk's sum].
            self._unit = 2.0 ** round(math.log2(float(count) * batch / n))
        return loss * (count / (self._unit or 1.0))

    def _check_shares(self, calls, loss, start, n, batch, target):
        """Raises ValueError where the loss, its chunk weighed by samples,
        adds a counted reduction that holds another share of the batch: See
        Note [A term that counts the batch otherwise]."""
        if self._as_declared:
            return
        for i, (out, rule, count) in enumerate(calls):
            if out is loss or count is None or not getattr(out, "requires_grad", False):
                continue
            c = float(count)
            key = (i, rule.kind, rule.name)
            if key not in self._shares:
                own = rule.kind == "classes" and rule.target is target and \
                    isinstance(self._full_target, torch.Tensor)
                self._shares[key] = (batch, self._batch_count(rule)) if own else (n, c)
            n0, c0 = self._shares[key]
            if _close(c * n0, c0 * n) or (n0 != batch and _close(c, c0)):
                continue
            if not _feeds(loss, out):
                continue
            what = "the whole batch" if n0 == batch else "the step's first micro-batch"
            raise ValueError(
                f"[Trainer.step] the loss adds a term that averages over what its samples "
                f"hold in different numbers ({rule.name}: {c:g} counted in samples "
                f"{start}..{start + n - 1}, {c0 / n0:.6g} per sample in {what}), but the loss "
                f"is weighed by samples: split, the gradients would not be the whole batch's. "
                f"Return that term alone, divide every term by the same count (a sum over "
                f"mask.sum()), or run the batch whole (a larger budget)")

    def unchecked_note(self):
        """The line a split step's notes carry while a check did not run for
        lack of room (See Note [A check with no room]), else ""."""
        if not self.unchecked:
            return ""
        return (f"whether {self.unchecked} mixes the batch's samples was not checked: the "
                f"device had no room for 2 samples run again beside the micro-batch; split, "
                f"the gradients are the whole batch's only where it does not (an in-batch "
                f"contrastive loss, a mean over the batch's dimension). A Trainer with a larger "
                f"budget checks it on its first split step; coupled='allow' says it does not")

    def finish_step(self):
        """After the step: grad_scale(), and the step's target and counts
        let go (the object lives as long as the Trainer)."""
        scale = self.grad_scale()
        self._full_target, self._denominators, self._counts = None, {}, {}
        self._sum_chunks, self._unit = False, None
        return scale

    def grad_scale(self):
        """The unit / the batch's counted targets when the chunks' losses were
        sums of counted targets over the unit (Note [Probing how the loss
        reduces], Note [The scale of a chunk's sum]), else None."""
        if not self._sum_chunks:
            return None
        # The chunks that completed partition the batch: a redo after an OOM
        # starts where the failed attempt did and replaces its entry.
        total = _partition_total(self._counts)
        return (self._unit or 1.0) / total if total else math.nan

    def _check_separable(self, output, target, target_dim, rule, rerun=None, refuse=True):
        """Raises ValueError (where `refuse`) when the loss of up to 8
        samples together is not their losses alone combined by `rule` (See
        Note [Probing how the loss reduces]), on the output's rows and, where
        they passed, on the step run again (Note [A forward that mixes the
        samples]); returns quietly where it cannot be checked."""
        rows = _samples(output, target, target_dim) is not None
        if not self._check_values(self._values(output, target, target_dim, rerun), rule,
                                  refuse, "the loss"):
            return
        if rows and refuse and rerun is not None:
            if self._kind is not None:
                rule = LossRule(self._kind, rule.name)
            try:
                self._check_values(self._values(None, None, target_dim, rerun), rule, refuse,
                                   "the model's forward")
            except ValueError:
                self._separable = False  # checked again at the next step, as the loss's
                raise

    def _check_values(self, probe, rule, refuse, where):
        """The check of _check_separable on one _Probe; False where it could
        not run."""
        if probe is None:
            self._separable = True
            return False
        value, tol, again = probe.value, probe.tolerance, probe.rerun
        seen = {}
        try:
            k, ((together, in_all), alone) = _values_in_room(value, probe.k, again, seen)
        except torch.cuda.OutOfMemoryError:
            if again is None:
                raise  # the step's to recover from, as any of its allocations
            # See Note [A check with no room].
            self._separable = True
            self.unchecked = where if refuse else ""  # coupled="allow": not asked
            return False
        except Exception:  # noqa: BLE001 - a loss that cannot run so is not checked
            self._separable = True
            return False
        if not math.isfinite(together):
            # NaN or inf, as the plain step's: nothing to compare; checked
            # again at the next micro-batch. (A NaN alone, with the samples
            # together finite, is the loss's own: o.std(0) of one sample.)
            return False
        combined = self._combined(rule, in_all, alone)
        if where == "the model's forward" and seen.get("stateful"):
            combined = None  # its draws and writes are named in the step's notes
        if combined is None:
            self._separable = True
            return False
        scale = max(max(abs(v) for v, _ in alone), abs(together), 1e-30)
        allowed = max(tol, dataclasses.replace(probe, k=k).agreement()) * scale
        if abs(together - combined) <= allowed:
            self._separable = True
            return True
        values = [v for v, _ in alone]
        other = {"sum": ("mean", sum(values) / k), "mean": ("sum", sum(values))}.get(rule.kind)
        if other is not None and abs(together - other[1]) <= allowed and self._kind is None:
            # See Note [A reduction over the batch's dimension].
            self._separable, self._kind = True, other[0]
            return True
        if not refuse:
            return True
        what = ("the layers that mix them: attention or a mean over the batch's dimension, "
                "routing with a capacity per batch" if where == "the model's forward" else
                "an in-batch contrastive loss, a batch statistic")
        raise ValueError(
            f"[Trainer.step] {where} mixes the batch's samples before it reduces them (on {k} "
            f"samples together it gave {together:.6g}; alone, combined as its {rule.name} "
            f"reduces them, {combined:.6g}): split into micro-batches, each would see only its "
            f"own samples ({what}) and the gradients would not be the whole batch's; run the "
            f"batch whole (a larger budget), or pass coupled='allow' to split anyway")

    def _combined(self, rule, in_all, alone):
        """The losses `alone` ((value, count) of each sample) combined as
        `rule` reduces them, for a check against their loss together (whose
        count is `in_all`); None where the counts cannot tell. Decides
        whether a .mean() weighs its chunks by their elements (See Note [A
        sum over a count])."""
        values = [v for v, _ in alone]
        counts = [c for _, c in alone]
        if rule.kind == "sum":
            return sum(values)
        known = in_all is not None and all(c is not None for c in counts)
        # Whether the count of the samples together is their counts' sum:
        # elements (tokens) each sample owns, not a size all share.
        owned = known and abs(in_all - sum(counts)) <= 1e-9 * max(1.0, abs(in_all))
        if rule.kind == "mean":
            # Elements the samples own: by count, exact also where the first
            # samples hold as many each and later ones do not.
            self._by_count = owned
            if not self._by_count:
                return sum(values) / len(values)
        elif rule.kind == "tokens" and known and not owned:
            raise ValueError(
                f"[Trainer.step] the loss divides a sum by a count that is not the samples' own "
                f"(on {len(counts)} samples together it is {in_all:.6g}; alone, "
                f"{sum(counts):.6g} in all): the micro-batches cannot be weighted by it; divide "
                f"by the count of the batch's own elements (mask.sum()), or run the batch whole "
                f"(a larger budget)")
        # Each weighted by its count (counted targets, elements, tokens).
        if any(c is None for c in counts) or sum(counts) == 0:
            return None
        return sum(v * c for v, c in zip(values, counts)) / sum(counts)

    def _probe(self, output, target, target_dim, rerun=None):
        """"mean" or "sum" from the loss's values on up to 8 samples together
        against each alone; raises ValueError when they say neither. A
        reduction= declared is checked by them too (See Note [A declared
        reduction is checked]), and used where they cannot run."""
        declared = self._declared
        if self._probed is not None or (declared is not None and self._separable):
            return self._probed or declared
        ask = ("pass reduction='mean' or 'sum' to the Trainer (how loss_fn reduces the "
               "batch), or return a torch loss function's result or a .mean()/.sum()")
        probe = self._values(output, target, target_dim, rerun)
        if probe is None:
            if declared is not None:
                self._probed = declared  # nothing to check it by
                return declared
            raise ValueError(f"[Trainer.step] cannot tell how loss_fn reduces the batch: {ask}")
        value, k, tol, again = probe.value, probe.k, probe.tolerance, probe.rerun
        try:
            with _rerun_quietly(again):
                together = value(0, k)[0]
                alone = [value(i, i + 1)[0] for i in range(k)]
        except Exception as e:  # noqa: BLE001 - a step that cannot run so is not probed
            if declared is not None:
                self._probed = declared
                return declared
            if again is None:
                raise
            raise ValueError(f"[Trainer.step] cannot tell how the step's loss reduces the "
                             f"batch (run again on its samples without grad, it raised "
                             f"{type(e).__name__}): {ask}") from None
        total = sum(alone)
        allowed = max(max(abs(v) for v in alone), abs(together), 1e-30) * max(
            tol, probe.agreement())
        is_mean = abs(together - total / k) <= allowed
        is_sum = abs(together - total) <= allowed
        seen = (f"on {k} samples it gave {together:.6g}; alone they give {total / k:.6g} on "
                f"average, {total:.6g} in all")
        if declared is not None and not (is_mean and is_sum) and \
                not (is_mean if declared == "mean" else is_sum):
            raise ValueError(
                f"[Trainer.step] reduction={declared!r}, but the loss is not the {declared} of "
                f"its samples' losses ({seen}): split, no weight per micro-batch gives the whole "
                f"batch's gradients (terms that average over different things, tokens and "
                f"samples; a term over the whole batch). Return one reduction (a torch loss "
                f"function's result, a .mean()/.sum(), a sum over mask.sum()), run the batch "
                f"whole (a larger budget), or pass coupled='allow' to split anyway")
        if is_mean == is_sum:
            if declared is not None:
                self._probed = declared  # both: a zero loss, as declared
                return declared
            raise ValueError(
                f"[Trainer.step] cannot tell how loss_fn reduces the batch ({seen}: "
                f"{'both' if is_mean else 'neither'} the mean {'and' if is_mean else 'nor'} the "
                f"sum): {ask}; a loss adding terms that average over different things (tokens "
                f"and samples) is neither, and reduction= cannot weight it")
        self._probed = "mean" if is_mean else "sum"
        return self._probed

    def _values(self, output, target, target_dim, rerun):
        """The _Probe of the loss on k samples: from loss_fn on the output's
        rows or, where the output cannot tell, from the step run again
        (rerun). None where neither can run."""
        dtypes = set()  # the losses' own: a float64 model's HF loss is float32

        def counted(run):
            mode = _Reductions()
            with mode:
                v = run()
            dtypes.add(v.dtype)
            c = next((c for out, _, c in mode.calls if out is v and c is not None), None)
            return float(v), (None if c is None else float(c))

        sample = _samples(output, target, target_dim)
        if sample is None:
            k = 0 if rerun is None else min(8, rerun.samples)
            if k < 2:
                return None
            return _Probe(lambda a, b: counted(lambda: rerun.run(a, b)), k,
                          _step_tolerance(rerun.module),
                          rerun, dtypes)
        o, tgt, k = sample

        def value(a, b):
            y = None if tgt is None else tgt.narrow(target_dim, a, b - a)
            return counted(lambda: self._loss_fn(o[a:b], y) if y is not None
                           else self._loss_fn(o[a:b]))
        # Rounding of the loss's dtype, summed over k values.
        return _Probe(value, k, 64 * k * torch.finfo(o.dtype if o.is_floating_point()
                                                     else torch.float32).eps)


def _close(a, b):
    """Counts equal to 1e-5 relative: See Note [A term that counts the batch
    otherwise]."""
    return abs(a - b) <= 1e-5 * max(abs(a), abs(b), 1e-30)


def _feeds(loss, out):
    """Whether `out` is in the autograd graph `loss` was made by."""
    node, seen = out.grad_fn, set()
    todo = [loss.grad_fn]
    while todo:
        f = todo.pop()
        if f is None or f in seen:
            continue
        if f is node:
            return True
        seen.add(f)
        todo.extend(g for g, _ in f.next_functions)
    return False


def _partition_total(counts):
    total, at = 0.0, 0
    for start in sorted(counts):
        if start < at:
            continue  # a failed attempt's entry a redo's chunks cover
        n, count = counts[start]
        total += float(count)
        at = start + n
    return total


def _samples(output, target, target_dim):
    """(output detached, target, k): up to 8 samples of one output tensor
    and its target to probe the loss on, or None where there are not."""
    out = output if isinstance(output, torch.Tensor) else None
    tgt = target if target is None or isinstance(target, torch.Tensor) else None
    if (out is None or out.dim() == 0 or out.shape[0] < 2 or
            (target is not None and (tgt is None or tgt.dim() <= target_dim
                                     or tgt.shape[target_dim] != out.shape[0]))):
        return None
    return out.detach(), tgt, min(8, out.shape[0])
