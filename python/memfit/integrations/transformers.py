"""memfit inside the Hugging Face Trainer: a callback that sizes the batch
from the Trainer's own loss before training, keeping the effective batch
exact, and sizes the evaluation batch apart.

    trainer = Trainer(model, args, train_dataset=ds,
                      callbacks=[FitBatchSize(budget="24GiB")])
    trainer.train()   # per_device_train_batch_size x gradient_accumulation_steps unchanged

Needs transformers (`pip install transformers`)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import sys
import time
import warnings
from typing import Any

import torch

try:
    import transformers
    from accelerate.utils import convert_outputs_to_fp32, get_mixed_precision_context_manager
    from transformers import TrainerCallback
except ImportError:
    raise ImportError(
        "[memfit.integrations.transformers] transformers is not installed: "
        "pip install transformers"
    ) from None

from .api import Size, UserStep, batch_size, host_memory, kept_rng, sequence_length, tensors_in
from .._native import native as _memfit
from .sizing import (BatchPlan, LoopStep, batch_bytes_per_sample, check_options, example_of,
                     plan_batch, plan_eval_batch, tell_change)
from ..train.length_sampler import LengthBatchSampler
from .length_batches import (check_length_options, dimensions_of, fit_per_length,
                             longest_example, longest_labels, pad_multiple, rebatched,
                             sample_lengths, token_accumulation)

__all__ = ["FitBatchSize", "trainer_step"]

log = logging.getLogger("memfit")


# Note [Where the HF Trainer takes its batch size]
# Read from transformers 5.18's trainer.py. Trainer.__init__ copies
# args.train_batch_size into trainer._train_batch_size, then calls the
# callbacks' on_init_end; train() builds the train DataLoader from
# _train_batch_size before on_train_begin (too late to change it). So the
# callback plans at on_init_end, on the Trainer under construction (the
# caller's frame: callbacks are not handed the Trainer), sets
# per_device_train_batch_size and gradient_accumulation_steps in args and
# refreshes _train_batch_size from them, as the Trainer does itself when
# hyperparameter search changes args (`self._train_batch_size =
# self.args.train_batch_size`). gradient_accumulation_steps and
# eval_batch_size are read from args when used. The loop holds an
# optimizer step's batches at once (get_batch_samples: the effective
# batch) and accelerate's DataLoader one more ahead: the effective batch's
# inputs are kept free beside the step.


def _trainer_under_construction(args):
    frame = sys._getframe(1)
    while frame is not None:
        obj = frame.f_locals.get("self")
        if isinstance(obj, transformers.Trainer) and obj.args is args:
            return obj
        frame = frame.f_back
    return None


def trainer_step(trainer: Any, what: str = "FitBatchSize") -> UserStep:
    """The HF Trainer's loss (trainer.compute_loss, a subclass's too, under
    its compute_loss_context_manager) as memfit's step."""

    def step(model, batch):
        with trainer.compute_loss_context_manager():
            return trainer.compute_loss(model, batch)

    return UserStep(step=step, what=what)


def _first_batch(dataloader, rows=False):
    """The first samples of the loader's first batch, collated in host
    memory (the loader's whole batch may not fit the device); the sampler's
    seed is put back, so training draws the same order. rows=True: (those,
    the rows the whole first batch holds)."""
    with kept_rng(dataloader), host_memory():
        first = next(iter(dataloader))
        example = example_of(first)
        return (example, batch_size(first, 0, "FitBatchSize")) if rows else example


# Note [A data collator that makes rows]
# A data_collator may give the model more rows than the samples it takes
# (two augmented views of each, concatenated: 2 rows a sample). memfit
# sizes rows; set as per_device_train_batch_size, the rows that fit made
# batches of twice as many, and the Trainer's loop ran out of memory. So
# where the first batch holds more rows than the loader's batch, k rows a
# sample rounded up (a tokenizing collator's windows: 6 rows for 4 texts of
# 1 or 2 windows, taken as 1 a sample, ran the Trainer out of memory at the
# batch set, every text 2 windows), the effective batch is planned in rows
# (k a sample) and the batch set is the samples whose rows fit, a divisor
# of the effective batch: per_device x accumulation stays the samples it
# was.
def _rows_per_sample(loader, rows) -> int:
    """k, the rows the data collator gives a sample, else 1: See Note [A
    data collator that makes rows]."""
    size = getattr(loader, "batch_size", None)
    if size is None:  # accelerate's DataLoaderShard batches by its batch sampler
        size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    if not isinstance(size, int) or size <= 0 or rows <= size:
        return 1
    return -(-rows // size)


def _in_samples(plan, per, effective, what) -> None:
    """`plan`, planned in rows of `per` a sample, set in samples: the
    largest divisor of `effective` whose rows fit."""
    if per == 1:
        return
    fit = max((d for d in range(1, effective + 1) if effective % d == 0 and d * per
               <= plan.batch_size), default=0)
    if not fit:
        raise _memfit.DoesNotFit(f"[{what}] {plan.batch_size} rows fit, and a sample of the "
                                 f"training data gives {per} (its data collator): no batch fits")
    plan.notes.append(f"the data collator gives {per} rows a sample: the {plan.batch_size} rows "
                      f"that fit are a batch of {fit} samples")
    plan.batch_size, plan.accumulation = fit, effective // fit


def _at_longest(trainer, batch, what):
    """A LongestExample: See Note [A first batch shorter than the data]
    (length_batches.py)."""
    return longest_example(trainer.train_dataset, trainer.data_collator, batch, what)


# Note [Checkpointing the Trainer turns on]
# TrainingArguments(gradient_checkpointing=True) is applied by train(), after
# on_init_end, where the callback plans: measured as it was, the step kept
# every activation, and the batch set was about half what the Trainer's
# loop runs. So the callback turns checkpointing on as train() does (the
# same arguments) for the training step's fit, and off again after, with
# the input-grad hook it adds: the model is left as it was.
@contextlib.contextmanager
def _checkpointing_as_trained(trainer):
    model, args = trainer.model, trainer.args
    turn_on = (args.gradient_checkpointing
               and callable(getattr(model, "gradient_checkpointing_enable", None))
               and not getattr(model, "is_gradient_checkpointing", True))
    if not turn_on:
        yield
        return
    had_hook = hasattr(model, "_require_grads_hook")
    kwargs = dict(args.gradient_checkpointing_kwargs or {})
    layered = {}  # transformers 5's own arguments, taken out of the kwargs as train() does
    if "every_n_layers" in inspect.signature(model.gradient_checkpointing_enable).parameters:
        layered = dict(every_n_layers=kwargs.pop("every_n_layers", 1),
                       offload=kwargs.pop("offload", False))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None, **layered)
    try:
        yield
    finally:
        model.gradient_checkpointing_disable()
        if not had_hook and hasattr(model, "_require_grads_hook"):
            model.disable_input_require_grads()


# Note [The mixed precision the Trainer's accelerator applies]
# TrainingArguments(bf16=True) (fp16=True) is applied by train() too:
# accelerator.prepare(model) wraps model.forward in autocast and converts
# its outputs to float32, after on_init_end. Measured as it was, the step
# ran in float32: on a wide model with short sequences the autocast's
# half-precision copies of the weights, saved for backward, outweigh the
# activations it halves, and the batch set (4 of GPT-2, 256 wide, 8 tokens,
# at 30 MiB) ran out of memory in the Trainer's loop, where 2 runs. So the
# callback wraps forward as prepare() does (accelerate's own functions) for
# its fits, training's and evaluation's, and puts the model's forward back.
@contextlib.contextmanager
def _precision_as_trained(trainer):
    accelerator, model = trainer.accelerator, trainer.model
    own = vars(model)
    if not getattr(accelerator, "native_amp", False) or "_original_forward" in own:
        yield  # no mixed precision, or a model prepared already
        return
    had, forward = "forward" in own, own.get("forward")
    autocast = get_mixed_precision_context_manager(accelerator.native_amp,
                                                   accelerator.autocast_handler)
    model.forward = convert_outputs_to_fp32(autocast(model.forward))
    try:
        yield
    finally:
        if had:
            model.forward = forward
        else:
            del model.forward


# Note [The outputs the evaluation loop keeps]
# With compute_metrics (and not prediction_loss_only or batch_eval_metrics),
# HF's evaluation_loop keeps each batch's logits and labels on the device,
# concatenated (torch.cat: the old and the new alive at once), until
# eval_accumulation_steps batches moved them to the host: the k-th batch's
# forward runs beside k - 1 batches' outputs, and its concatenation holds
# 2k. Sized from the loss alone, the eval batch set (30 of a GPT-2 with k = 4
# at 8 MiB) ran out of memory in the Trainer's evaluation, where 21 runs.
# So the eval step fitted holds those bytes as the loop does, from the
# outputs per sample of one prediction_step on the example (on the host).
# Without eval_accumulation_steps every batch's outputs stay, whatever the
# batch: not sized (FitBatchSize's doc).
def _kept_window(trainer) -> int | None:
    """Batches of outputs the evaluation loop keeps on the device at most
    (1: each moved off after its step, or none kept; None: every batch's)."""
    args = trainer.args
    if trainer.compute_metrics is None or args.prediction_loss_only or args.batch_eval_metrics:
        return 1
    return args.eval_accumulation_steps


# Note [The evaluation Seq2SeqTrainer generates]
# Seq2SeqTrainer(predict_with_generate=True) with compute_metrics runs
# model.generate (generation_num_beams beams, up to generation_max_length)
# in each evaluation step before the loss's forward. Sized from the loss
# alone, the eval batch set (39 of a T5 with 4 beams, 64 long, at 8 MiB) ran
# out of memory in the Trainer's evaluation, as 20 did; 12 runs (the fit's
# answer now) and 13 runs out. So the eval
# step fitted is the Trainer's prediction_step, with the generate()
# arguments Seq2SeqTrainer.evaluate passes it from args.
def _generation_kwargs(trainer) -> dict | None:
    """generate()'s arguments as evaluate() takes them from args; None
    where the evaluation does not generate."""
    args = trainer.args
    if (not isinstance(trainer, transformers.Seq2SeqTrainer)
            or not getattr(args, "predict_with_generate", False)
            or trainer.compute_metrics is None or args.prediction_loss_only):
        return None
    kwargs = {}
    if args.generation_max_length is not None:
        kwargs["max_length"] = args.generation_max_length
    if args.generation_num_beams is not None:
        kwargs["num_beams"] = args.generation_num_beams
    return kwargs


def _outputs_per_sample(trainer, batch) -> float:
    """Bytes of logits and labels the evaluation loop keeps per sample:
    one prediction_step on `batch`, in host memory."""
    model = trainer.model
    training = model.training
    try:
        with kept_rng(), host_memory():
            model.eval()
            _, logits, labels = trainer.prediction_step(model, batch, False,
                                                        **(_generation_kwargs(trainer) or {}))
            if trainer.preprocess_logits_for_metrics is not None and logits is not None:
                logits = trainer.preprocess_logits_for_metrics(logits, labels)
            kept = sum(t.nbytes for t in tensors_in((logits, labels)))
    finally:
        model.train(training)
    return kept / batch_size(batch, 0, "FitBatchSize")


def _eval_step(trainer, how: UserStep, batch) -> UserStep:
    """The evaluation step as the loop runs it: See Note [The outputs the
    evaluation loop keeps] and [The evaluation Seq2SeqTrainer generates]."""
    generation = _generation_kwargs(trainer)
    if generation is not None:
        def predict(model, x):
            return trainer.prediction_step(model, x, False, **generation)[0]

        how = dataclasses.replace(how, step=predict)
    window = _kept_window(trainer)
    if window is None or window < 2:
        return how
    per_sample = _outputs_per_sample(trainer, batch)

    def step(model, x):
        n, device = batch_size(x, 0, "FitBatchSize"), next(model.parameters()).device
        held = torch.empty(int((window - 1) * per_sample * n), dtype=torch.uint8, device=device)
        loss = how.step(model, x)
        # This batch's outputs and the concatenation of all the window's.
        joined = torch.empty(int((window + 1) * per_sample * n), dtype=torch.uint8, device=device)
        del held, joined
        return loss

    return dataclasses.replace(how, step=step)


def _warn_every_output_kept(trainer, dataset, batch, room: int) -> None:
    """One warning line where the evaluation keeps every batch's outputs
    (no eval_accumulation_steps) and they and their last concatenation
    outgrow the room the evaluation has: no eval batch helps."""
    samples = len(dataset) if hasattr(dataset, "__len__") else 0
    kept = int(2 * _outputs_per_sample(trainer, batch) * samples)
    if kept > room:
        fb = _memfit.format_bytes
        warnings.warn(
            f"[FitBatchSize] compute_metrics keeps every evaluation batch's logits and labels on "
            f"the device, {fb(kept)} for {samples} samples with their last concatenation, more "
            f"than the {fb(room)} the evaluation has: set eval_accumulation_steps (the batches "
            f"it keeps are sized in)", UserWarning, stacklevel=2)


def _set_batch(trainer, batch, accumulation, what) -> None:
    """Sets the batch and the accumulation in the Trainer's args, and checks
    that get_train_dataloader batches by them: one overridden with a batch
    of its own ran out of memory in the Trainer's loop at the batch of 64
    it kept where memfit had set 16."""
    args = trainer.args
    was = (args.per_device_train_batch_size, args.gradient_accumulation_steps)
    args.per_device_train_batch_size, args.gradient_accumulation_steps = batch, accumulation
    trainer._train_batch_size = args.train_batch_size  # See Note [Where the HF ...]
    if batch == was[0] or not _users_train_loader(trainer):
        return
    built = getattr(trainer.get_train_dataloader(), "batch_size", None)
    if isinstance(built, int) and built != trainer._train_batch_size:
        args.per_device_train_batch_size, args.gradient_accumulation_steps = was
        trainer._train_batch_size = args.train_batch_size
        raise ValueError(
            f"[{what}] get_train_dataloader builds batches of {built} with "
            f"per_device_train_batch_size set to {batch}: it must batch by "
            f"self._train_batch_size, as the Trainer's own does, or FitBatchSize sizes a batch "
            f"the loop does not run; {batch} fits")


def _users_train_loader(trainer) -> bool:
    """Whether get_train_dataloader may be the user's (a subclass's or an
    instance's): the Trainer's own batches by _train_batch_size, and
    building it again only to check that costs a pass over every sample
    with group_by_length (LengthGroupedSampler reads each one's length)."""
    subclass = type(trainer).get_train_dataloader is not transformers.Trainer.get_train_dataloader
    return subclass or "get_train_dataloader" in vars(trainer)


# Note [auto_find_batch_size beside FitBatchSize]
# With auto_find_batch_size, train() resuming from a checkpoint takes the
# checkpoint's train_batch_size in place of the batch set here, and an OOM
# shrinks the batch (by 0.9 in accelerate 1.15) keeping the accumulation:
# from a checkpoint saved at 64, memfit's 16 x 4 trained 19 x 4 after ten
# out-of-memory retries (64, 57, ... 22). So the callback turns it off and
# says so: the batch it set is the one the loop runs, and an OOM is raised.
def _auto_find_off(args, plan) -> None:
    if not args.auto_find_batch_size:
        return
    args.auto_find_batch_size = False
    plan.notes.append("auto_find_batch_size turned off")
    warnings.warn(
        f"[FitBatchSize] auto_find_batch_size turned off: the batch is the one set here "
        f"({plan.batch_size} x {plan.accumulation}); it would take a checkpoint's batch on "
        f"resume_from_checkpoint and shrink the batch on an OOM, changing the effective batch",
        UserWarning, stacklevel=3)


def _optimizer_for(trainer, model, given):
    if given is not None:
        return given
    cls, kwargs = trainer.get_optimizer_cls_and_kwargs(trainer.args, model)
    return cls([p for p in model.parameters() if p.requires_grad], **kwargs)


class FitBatchSize(TrainerCallback):
    """Sets per_device_train_batch_size and gradient_accumulation_steps
    before training, measured from the Trainer's own loss and optimizer
    settings: the largest divisor of your effective batch
    (per_device_train_batch_size x gradient_accumulation_steps as you set
    them) that fits, and the accumulation that keeps the product exact. No
    out-of-memory trials: it replaces auto_find_batch_size, which shrinks the
    batch on each OOM and leaves the accumulation as it was (the effective
    batch changes), and turns it off where set, with a warning (See Note
    [auto_find_batch_size beside FitBatchSize]). The evaluation batch is
    sized apart: your per_device_eval_batch_size where it fits beside the
    training's optimizer state, else the largest that does (an eval OOM
    never shrinks the training batch).

        Trainer(model, args, train_dataset=ds, eval_dataset=ev,
                callbacks=[FitBatchSize(budget="24GiB")])

    budget: "24GiB" or bytes; None: what memfit.simulated_device leaves,
    else the CUDA card's free memory. Pass it in Trainer(callbacks=[...]):
    it plans when the Trainer is built (See Note [Where the HF Trainer
    takes its batch size]). `plan` (a memfit BatchPlan) says what was set.
    With compute_metrics the outputs the evaluation keeps until
    eval_accumulation_steps batches go to the host are sized in; without
    eval_accumulation_steps it keeps every batch's, growing with the eval
    set: not sized here (a warning says when they outgrow the budget).

    Variable-length data: FitBatchSize(seq_dim=1, lengths=[128, 512, 2048])
    fits the largest batch at each length from the Trainer's own loss
    (`length_fit`, a LengthFit) and trains on the same dataset and collator
    batched by a LengthBatchSampler (`sampler`): each batch, padded to its
    longest sample, fits. tokens_per_step=N keeps a fixed effective batch
    in tokens: gradient_accumulation_steps micro-batches of at most N / k
    padded tokens each (See Note [A loader batched by length],
    length_batches.py). sample_lengths: each training sample's length (a
    list, or a function of a sample); default: read from each sample's
    input_ids. Without tokens_per_step the accumulation stays yours.
    """

    def __init__(self, budget: Size | None = None, target_device: str | None = None,
                 size_eval: bool = True, seq_dim: int | None = None, lengths: Any = None,
                 sample_lengths: Any = None, tokens_per_step: int | None = None) -> None:
        check_options("FitBatchSize", budget, target_device)
        self.tokens_per_step = check_length_options("FitBatchSize", seq_dim, lengths,
                                                    sample_lengths, tokens_per_step)
        self.budget = budget
        self.target_device = target_device
        self.size_eval = size_eval
        self.seq_dim, self.lengths, self.sample_lengths = seq_dim, lengths, sample_lengths
        self.length_fit = None  # a LengthFit, with lengths=
        self.sampler: LengthBatchSampler | None = None
        self.plan: BatchPlan | None = None

    def on_init_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        trainer = _trainer_under_construction(args)
        if trainer is None:
            return  # on_train_begin says how to pass it
        self.plan = self.fit(trainer, optimizer)

    def on_train_begin(self, args, state, control, **kwargs):
        if self.plan is None:
            raise ValueError(
                "[FitBatchSize] it was added after the Trainer was built, when the batch size is "
                "fixed already: pass it as Trainer(..., callbacks=[FitBatchSize(...)])"
            )

    def fit(self, trainer: Any, optimizer: Any = None) -> BatchPlan:
        """Measure and set the batch sizes of `trainer` (what on_init_end
        does); returns the BatchPlan."""
        what = "FitBatchSize"
        began = time.perf_counter()
        if self.lengths is not None:
            return self._fit_lengths(trainer, optimizer, began)
        args, model = trainer.args, trainer.model
        before = f"{args.per_device_train_batch_size} x {args.gradient_accumulation_steps}"
        effective = args.per_device_train_batch_size * args.gradient_accumulation_steps
        how = trainer_step(trainer, what)
        loader = trainer.get_train_dataloader()
        first, rows = _first_batch(loader, rows=True)
        found = _at_longest(trainer, first, what)
        batch, longer = found.batch, found.note
        # See Note [A data collator that makes rows] and [A collate function that
        # makes rows of a sample] (length_batches.py).
        per = max(_rows_per_sample(loader, rows), found.rows)
        loader = None
        reserve = int(batch_bytes_per_sample(batch) * effective * per)
        opt = _optimizer_for(trainer, model, optimizer)
        # The optimizer's step and zero_grad end each optimizer step; between
        # accumulated micro-batches the gradients stay.
        with _precision_as_trained(trainer), _checkpointing_as_trained(trainer):
            # See Notes [The mixed precision the Trainer's ...], [Checkpointing the Trainer ...]
            plan = plan_batch(model, batch, opt, whole=LoopStep(how, True),
                              accumulated=LoopStep(how, False), budget=self.budget, what=what,
                              effective=effective * per, reserve_bytes=reserve,
                              target_device=self.target_device)
        _in_samples(plan, per, effective, what)
        if longer:
            plan.notes.append(longer)
        _set_batch(trainer, plan.batch_size, plan.accumulation, what)
        if self.size_eval and trainer.eval_dataset is not None:
            self._fit_eval(trainer, how, plan)
        _auto_find_off(args, plan)
        tell_change(what, before, plan, time.perf_counter() - began)
        log.info(plan.summary())
        for note in plan.notes:
            log.info("memfit: %s", note)
        return plan

    def _fit_eval(self, trainer, how, plan):
        """Sets the evaluation batch: See FitBatchSize's doc. Named
        evaluation sets (a dict) run one after the other at one batch: the
        smallest that fits each."""
        args, sets = trainer.args, trainer.eval_dataset
        names = list(sets) if isinstance(sets, dict) else [None]
        size = min(self._eval_size(trainer, how, plan, name) for name in names)
        asked, args.per_device_eval_batch_size = args.per_device_eval_batch_size, size
        plan.eval_batch_size = size
        built = (getattr(trainer.get_eval_dataloader(names[0]), "batch_size", None)
                 if size < asked else None)
        if isinstance(built, int) and built > args.eval_batch_size:  # it would run out
            args.per_device_eval_batch_size = asked
            raise ValueError(
                f"[FitBatchSize] get_eval_dataloader builds batches of {built} with "
                f"per_device_eval_batch_size set to {size}: it must batch by "
                f"args.eval_batch_size, as the Trainer's own does, or the evaluation runs at "
                f"{built}; {size} fits")

    def _eval_size(self, trainer, how, plan, name) -> int:
        """The largest evaluation batch that fits the set `name` (None: the
        only one)."""
        dataset = trainer.eval_dataset if name is None else trainer.eval_dataset[name]
        # The evaluation loader is not shuffled: its first batch is the first
        # samples', as long as they are (See Note [A first batch shorter than
        # the data], length_batches.py).
        loader = trainer.get_eval_dataloader(name)
        first, rows = _first_batch(loader, rows=True)
        found = longest_example(dataset, trainer.data_collator, first, "FitBatchSize",
                                samples="evaluation")
        eval_batch, per = found.batch, max(_rows_per_sample(loader, rows), found.rows)
        loader = None
        if found.note:
            plan.notes.append(f"evaluation{'' if name is None else f' {name!r}'}: {found.note}")
        with _precision_as_trained(trainer):  # See Note [The mixed precision the Trainer's ...]
            how = _eval_step(trainer, how, eval_batch)  # See Note [The outputs the evaluation ...]
            size, f = plan_eval_batch(
                trainer.model, eval_batch, how, budget=self.budget, what="FitBatchSize",
                held_bytes=plan.optimizer_state_bytes + plan.reserved_bytes,
                cap=trainer.args.per_device_eval_batch_size * per,
                target_device=self.target_device)
            if _kept_window(trainer) is None:
                _warn_every_output_kept(trainer, dataset, eval_batch, f.budget_bytes)
        if size < per:  # in rows, `per` a sample: See Note [A data collator that makes rows]
            raise _memfit.DoesNotFit(f"[FitBatchSize] {size} evaluation rows fit, and an "
                                     f"evaluation sample gives {per} (its data collator): no "
                                     f"evaluation batch fits")
        return size // per

    def _fit_lengths(self, trainer, optimizer, began):
        """fit() with lengths=: See Note [A loader batched by length]."""
        what = "FitBatchSize"
        args, model = trainer.args, trainer.model
        how = trainer_step(trainer, what)
        batch = _first_batch(trainer.get_train_dataloader())
        # See Note [Labels of their own length under lengths=] (length_batches.py).
        batch, longer = longest_labels(trainer.train_dataset, trainer.data_collator, batch, what)
        length = sequence_length(batch, self.seq_dim, what)
        accumulation = args.gradient_accumulation_steps
        # The loop holds an optimizer step's batches: See Note [Where the HF
        # Trainer takes its batch size].
        tokens = self.tokens_per_step or args.per_device_train_batch_size * accumulation * length
        reserve = int(batch_bytes_per_sample(batch) / length * tokens)
        kept = self.tokens_per_step is not None or accumulation > 1  # gradients between
        plans = []
        with _precision_as_trained(trainer), _checkpointing_as_trained(trainer):
            # See Notes [The mixed precision the Trainer's ...], [Checkpointing the Trainer ...]
            fit = fit_per_length(model, batch, _optimizer_for(trainer, model, optimizer),
                                 LoopStep(how, not kept), seq_dim=self.seq_dim,
                                 lengths=self.lengths, budget=self.budget, what=what,
                                 reserve_bytes=reserve, target_device=self.target_device,
                                 pad_to_multiple_of=pad_multiple(trainer.data_collator),
                                 plans=plans)
        max_tokens = None
        if self.tokens_per_step is not None:
            accumulation, max_tokens = token_accumulation(self.tokens_per_step, fit)
            args.gradient_accumulation_steps = accumulation
        # train_sampling_strategy="sequential": dataset order every epoch (grouped
        # by length), as the Trainer's SequentialSampler and Lightning's loader.
        sampler = LengthBatchSampler(
            sample_lengths(trainer.train_dataset, self.seq_dim, self.sample_lengths, what,
                           batch_dims=dimensions_of(batch)), fit,
            shuffle=getattr(args, "train_sampling_strategy", None) != "sequential",
            seed=args.seed, max_tokens=max_tokens, num_replicas=args.world_size,
            rank=args.process_index, drop_last=bool(args.dataloader_drop_last),
            pad_to_multiple_of=pad_multiple(trainer.data_collator))
        built = trainer.get_train_dataloader

        def get_train_dataloader():
            loader = trainer.accelerator.prepare(rebatched(built(), sampler))
            shard = getattr(loader, "batch_sampler", None)
            if getattr(shard, "batch_sampler", None) is sampler:
                # The sampler shares the batches over the ranks itself, as
                # HF does for its BatchRebalanceSampler.
                shard.num_processes, shard.process_index = 1, 0
                # The loader's set_epoch (the HF Trainer calls it each epoch)
                # stops at accelerate's shard: without this every epoch
                # repeated epoch 0's batches.
                shard.set_epoch = sampler.set_epoch
            return loader

        trainer.get_train_dataloader = get_train_dataloader
        self.length_fit, self.sampler = fit, sampler
        first = next(iter(fit.fits.values()))
        plan = BatchPlan(batch_size=fit.at(fit.longest), accumulation=accumulation,
                         max_batch=fit.at(min(fit.lengths)), fits=list(fit.fits.values()),
                         budget_bytes=first.budget_bytes, reserved_bytes=reserve)
        plan.optimizer_state_bytes = max(p.optimizer_state_bytes for p in plans)
        if longer:
            plan.notes.append(longer)
        if self.size_eval and trainer.eval_dataset is not None:  # as without lengths=
            self._fit_eval(trainer, how, plan)
        plan.notes.append(f"batched by length: {fit!r}; {len(sampler)} batches per epoch"
                          + (f", at most {max_tokens} padded tokens each, {accumulation} per "
                             f"optimizer step" if max_tokens else ""))
        log.info("memfit: %s (%.1f s)", plan.notes[-1], time.perf_counter() - began)
        _auto_find_off(args, plan)
        return plan
