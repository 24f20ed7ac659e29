"""The user's training step, however it is written, as the one thing every
memfit front runs: how a loss comes out of a batch. profile, find_batch_size,
advise, memfit.Trainer and the framework integrations resolve what the user
gave (loss_fn, a model that computes its own loss, or a step function) into
a UserStep here, and the recorders call its forward and loss.

See Note [The step function's contract]."""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Mapping
from typing import Any, Callable

import torch

from .training_step import call_model, compute_loss

__all__ = ["UserStep"]


# Note [The step function's contract]
# step(model, batch) -> loss. memfit calls it where the plain step calls
# model(batch) and loss_fn:
# - batch: the user's batch, or a part of it cut along batch_dim (a probe's
#   samples, a micro-batch of the Trainer), of the kind the user gave: a
#   tensor, a tuple or list, a dict, a Hugging Face BatchEncoding;
# - model: the model the user passed (inside a rehearsal its parameters are
#   memfit's copies, swapped in: the step must call this model, not another
#   reference to the weights);
# - it returns the loss: a scalar tensor with a gradient (or a mapping with
#   one under "loss", as a Lightning training_step or an HF model output
#   does). memfit runs the backward, the optimizer step and zero_grad, so
#   the step must not: the Trainer weights each micro-batch's loss by its
#   share of the batch before its backward (the accumulated gradients are
#   the whole batch's), and the report keeps backward and the optimizer
#   step as phases of their own. Lightning's training_step and the HF
#   Trainer's compute_loss have this shape already.
# The step's forward and loss are one phase, "forward", in the reports.
#
# Note [A step of several backwards]
# A loop may run one backward per loss, the graph kept for the next
# (l1.backward(retain_graph=True); l2.backward()): each backward holds the
# whole graph's saved tensors, where the backward of l1 + l2 frees them as
# it goes. Given step= returning l1 + l2, find_batch_size answered 1551,
# "verified", where the user's loop of two backwards ran out above 1440. So
# the step may return the losses as a list or tuple: memfit runs their
# backwards in turn, the graph kept for all but the last, as that loop does
# (record.py); a front that runs one backward (the Trainer) takes their sum,
# the same gradients.


class StepError(ValueError):
    """The step gives no loss memfit can train on: a one-line message
    naming the operation and the fix. A ValueError; never swallowed by a
    plan that falls back (the step itself would fail the same way)."""


def is_hf_model(model: torch.nn.Module) -> bool:
    """Whether `model` is a Hugging Face PreTrainedModel, without importing
    transformers (a model of it means the user imported it already)."""
    transformers = sys.modules.get("transformers")
    if transformers is None:
        return False
    base = getattr(transformers, "PreTrainedModel", None)
    return isinstance(base, type) and isinstance(model, base)


def _takes_labels(model):
    try:
        return "labels" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return True  # cannot tell: the batch decides


def _unwrapped(model):
    # DistributedDataParallel (and other wrappers with .module) call the
    # model they wrap.
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else model


def output_loss(output: Any) -> torch.Tensor | None:
    """The loss a model's output carries (a Hugging Face ModelOutput given
    labels, a dict with "loss"), or None."""
    if isinstance(output, Mapping):
        loss = output.get("loss")
        return loss if isinstance(loss, torch.Tensor) else None
    return None


def _fields(output):
    return ", ".join(f"out.{k}" for k in list(output.keys())[:4])


@dataclasses.dataclass(frozen=True)
class UserStep:
    """How memfit gets the loss of a batch: loss_fn(model(batch), target),
    the loss the model's output carries (loss_fn None), or step(model,
    batch). `what` tags the errors with the operation the user called.
    `held_batches`: batches a framework's loop holds beside the step's own
    (Lightning prefetches the next one); the recorded step holds as many
    copies of its batch, so that a batch fitted to the budget leaves room
    for them."""

    loss_fn: Callable | None = None
    step: Callable | None = None
    what: str = "profile"
    held_batches: int = 0

    def forward(self, model: torch.nn.Module, batch: Any) -> Any:
        """The forward phase: the model's output, or the step's loss."""
        if self.step is not None:
            before = _grads(model)
            out = self.step(model, batch)
            if _wrote_grads(before, _grads(model)):
                raise StepError(
                    f"[{self.what}] the step changed the parameters' .grad (it ran backward "
                    f"itself): step(model, batch) must return the loss with its graph; memfit "
                    f"runs backward, the optimizer step and zero_grad")
            return out
        return call_model(model, batch)

    def loss(self, output: Any, target: Any = None) -> torch.Tensor:
        """The loss phase: the scalar loss of what forward() returned."""
        if self.step is not None:
            parts = self.losses(output)
            loss = output_loss(output) if isinstance(output, Mapping) else output
            if parts:  # See Note [A step of several backwards].
                loss = sum(parts[1:], parts[0])
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                got = (f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor)
                       else type(output).__name__)
                raise StepError(
                    f"[{self.what}] the step returned {got}: step(model, batch) must return "
                    f"the loss, a scalar tensor (or a list of them, each backward in turn); "
                    f"memfit runs backward and the optimizer step"
                )
            return loss
        if self.loss_fn is None and isinstance(output, Mapping):
            loss = output_loss(output)
            if loss is not None and target is None:
                return compute_loss(loss, None, None, self.what)  # checks it is a scalar
            if target is None:
                raise StepError(
                    f"[{self.what}] the model returned a {type(output).__name__} with no loss "
                    f"({_fields(output)}; no labels in the batch?): pass loss_fn=lambda out, "
                    f"target: ... computing it from out.logits, or put labels in the batch"
                )
            raise StepError(
                f"[{self.what}] the model returned a {type(output).__name__}, not a tensor, "
                f"and a target is given: pass loss_fn=lambda out, target: ... computing the "
                f"loss from out.logits"
            )
        return compute_loss(output, target, self.loss_fn, self.what)

    def losses(self, output: Any) -> list | None:
        """The losses a step returned as a list or tuple of scalar tensors,
        each backward in turn (See Note [A step of several backwards]); else
        None."""
        # Each with a gradient: (loss, accuracy) is not two losses.
        if (self.step is None or not isinstance(output, (list, tuple)) or not output
                or not all(isinstance(t, torch.Tensor) and t.dim() == 0 and t.requires_grad
                           for t in output)):
            return None
        return list(output)

    def run(self, model: torch.nn.Module, batch: Any, target: Any = None) -> torch.Tensor:
        """forward and loss: the loss of `batch`, ready for its backward."""
        return self.loss(self.forward(model, batch), target)

    def check_batch(self, model: torch.nn.Module, batch: Any, target: Any = None) -> None:
        """Raise StepError before anything runs when this batch cannot give
        a loss: a Hugging Face model with no loss_fn needs labels in it; a
        step takes its target inside the batch."""
        if self.step is not None and target is not None:
            raise StepError(
                f"[{self.what}] pass the target inside the batch the step is given, not as a "
                f"separate target: step(model, batch) computes the loss"
            )
        if self.step is not None or self.loss_fn is not None or target is not None:
            return
        inner = _unwrapped(model)
        if is_hf_model(inner) and isinstance(batch, Mapping) and "labels" not in batch:
            keys = ", ".join(list(batch)[:4])
            raise StepError(
                f"[{self.what}] {type(inner).__name__} computes its loss only from labels and "
                f"the batch has none (keys {keys}): add labels to the batch (labels=input_ids "
                f"for a causal LM), or pass loss_fn=lambda out, target: ... computing it from "
                f"out.logits"
            )

    @property
    def note(self) -> str | None:
        """What a report of this step says about it, or None."""
        if self.step is None:
            return None
        name = getattr(self.step, "__qualname__", type(self.step).__name__)
        return (f"the step is the user's function {name}: its forward and loss are one "
                f"phase (forward)")


def _grads(model):
    """Each parameter's .grad as the object and its version."""
    return [None if p.grad is None else (id(p.grad), p.grad._version)
            for p in model.parameters()]


def _wrote_grads(before, after):
    """Whether a .grad was made or written between two _grads(): a step
    that ran backward itself. One set to None is not (Lightning's step runs
    the closure's zero_grad(set_to_none=True))."""
    return any(a is not None and a != b for b, a in zip(before, after))


def as_user_step(loss_fn: Any = None, step: Callable | None = None, what: str = "profile",
                 model: torch.nn.Module | None = None) -> UserStep:
    """The UserStep of what the user gave, checked before anything runs;
    one already resolved (a front calling another) is returned as it is.
    `model`: checked that it can give a loss without loss_fn."""
    if isinstance(loss_fn, UserStep):
        return loss_fn
    if step is not None:
        if loss_fn is not None:
            raise StepError(
                f"[{what}] pass step= or loss_fn=, not both: the step computes the loss itself"
            )
        if not callable(step):
            raise StepError(
                f"[{what}] step must be a function step(model, batch) -> loss, got "
                f"{type(step).__name__}"
            )
        _check_arity(step, what)
        return UserStep(step=step, what=what)
    if loss_fn is not None and not callable(loss_fn):
        raise StepError(
            f"[{what}] loss_fn must be a function (output, target) -> scalar tensor, got "
            f"{type(loss_fn).__name__}"
        )
    resolved = UserStep(loss_fn=loss_fn, what=what)
    if model is not None and loss_fn is None:
        inner = _unwrapped(model)
        if is_hf_model(inner) and not _takes_labels(inner):
            raise StepError(
                f"[{what}] {type(inner).__name__} returns a ModelOutput with no loss (its "
                f"forward takes no labels): pass loss_fn=lambda out, target: ... computing "
                f"the loss from the output (out.logits of a *ForCausalLM, "
                f"out.last_hidden_state here), or step="
            )
    return resolved


def _check_arity(step, what):
    try:
        sig = inspect.signature(step)
    except (TypeError, ValueError):
        return  # a builtin or C function: it will say so itself
    try:
        sig.bind(None, None)
    except TypeError:
        raise StepError(
            f"[{what}] step must take (model, batch) and return the loss; {sig} does not "
            f"take two arguments"
        ) from None
