"""memfit inside the Hugging Face Trainer: a callback that sizes the batch
from the Trainer's own loss before training, keeping the effective batch
exact, and sizes the evaluation batch apart.

    trainer = Trainer(model, args, train_dataset=ds,
                      callbacks=[FitBatchSize(budget="24GiB")])
    trainer.train()   # per_device_train_batch_size x gradient_accumulation_steps unchanged

Needs transformers (`pip install transformers`)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import torch

try:
    import transformers
    from transformers import TrainerCallback
except ImportError:
    raise ImportError(
        "[memfit.integrations.transformers] transformers is not installed: "
        "pip install transformers"
    ) from None

from .api import Size, UserStep, host_memory, kept_rng
from .sizing import (BatchPlan, LoopStep, batch_bytes_per_sample, check_options, example_of,
                     plan_batch, plan_eval_batch, tell_change)

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


def _first_batch(dataloader):
    """The first samples of the loader's first batch, collated in host
    memory (the loader's whole batch may not fit the device); the sampler's
    seed is put back, so training draws the same order."""
    with kept_rng(), host_memory():
        return example_of(next(iter(dataloader)))


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
    out-of-memory trials: it replaces auto_find_batch_size, which halves the
    batch on each OOM and leaves the accumulation as it was (the effective
    batch changes). The evaluation batch is sized apart: your
    per_device_eval_batch_size where it fits beside the training's
    optimizer state, else the largest that does (an eval OOM never shrinks
    the training batch).

        Trainer(model, args, train_dataset=ds, eval_dataset=ev,
                callbacks=[FitBatchSize(budget="24GiB")])

    budget: "24GiB" or bytes; None: what memfit.simulated_device leaves,
    else the CUDA card's free memory. Pass it in Trainer(callbacks=[...]):
    it plans when the Trainer is built (See Note [Where the HF Trainer
    takes its batch size]). `plan` (a memfit BatchPlan) says what was set.
    An evaluation that keeps every batch's logits (compute_metrics without
    eval_accumulation_steps) grows with the eval set: not sized here.
    """

    def __init__(self, budget: Size | None = None, target_device: str | None = None,
                 size_eval: bool = True) -> None:
        check_options("FitBatchSize", budget, target_device)
        self.budget = budget
        self.target_device = target_device
        self.size_eval = size_eval
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
        args, model = trainer.args, trainer.model
        before = f"{args.per_device_train_batch_size} x {args.gradient_accumulation_steps}"
        effective = args.per_device_train_batch_size * args.gradient_accumulation_steps
        how = trainer_step(trainer, what)
        batch = _first_batch(trainer.get_train_dataloader())
        reserve = int(batch_bytes_per_sample(batch) * effective)
        opt = _optimizer_for(trainer, model, optimizer)
        # The optimizer's step and zero_grad end each optimizer step; between
        # accumulated micro-batches the gradients stay.
        plan = plan_batch(model, batch, opt, whole=LoopStep(how, True),
                          accumulated=LoopStep(how, False), budget=self.budget, what=what,
                          effective=effective, reserve_bytes=reserve,
                          target_device=self.target_device)
        args.per_device_train_batch_size = plan.batch_size
        args.gradient_accumulation_steps = plan.accumulation
        trainer._train_batch_size = args.train_batch_size  # See Note [Where the HF ...]
        if self.size_eval and trainer.eval_dataset is not None:
            eval_batch = _first_batch(trainer.get_eval_dataloader())
            size, _ = plan_eval_batch(
                model, eval_batch, how, budget=self.budget, what=what,
                held_bytes=plan.optimizer_state_bytes + reserve,
                cap=args.per_device_eval_batch_size, target_device=self.target_device)
            args.per_device_eval_batch_size = plan.eval_batch_size = size
        if args.auto_find_batch_size:
            plan.notes.append("auto_find_batch_size is on: it would only act on an OOM, and "
                              "would then change the effective batch; memfit's batch fits")
        tell_change(what, before, plan, time.perf_counter() - began)
        log.info(plan.summary())
        for note in plan.notes:
            log.info("memfit: %s", note)
        return plan
