"""The loop the user trains with, as memfit records it: where zero_grad
sits and how, how many micro-batches an optimizer step takes, and the mode
the model trains in. profile, find_batch_size, advise, the Trainer and the
integrations take it from the user's arguments here, checked once; the step
protocol (core/plan/step_protocol.h) runs its order. See Note [The loop the
user runs] there."""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from .._native import format_bytes

__all__: list = []

# Where the loop calls zero_grad: after the optimizer step (PyTorch's
# quickstart), or just before backward (the tutorial order `loss = ...;
# opt.zero_grad(); loss.backward(); opt.step()`: the last step's gradients
# are alive through the forward).
ZERO_GRAD_PLACES = ("after_step", "before_backward")


@dataclasses.dataclass(frozen=True)
class Loop:
    """set_to_none: zero_grad frees the gradients (True, torch's default) or
    zeroes them in place (False: alive through every forward).
    accumulation_steps: micro-batches per optimizer step (the gradients of
    the first are alive through the later ones). zero_grad: one of
    ZERO_GRAD_PLACES. train_mode: the step is measured with model.train()
    (True: a model left in eval mode after validation, or from
    from_pretrained, trains in train mode); False: each module's train/eval
    flag as it is (a model trained in eval mode on purpose). keep_output:
    the model's output stays alive until the next forward replaces it, as
    `pred = model(X); loss = loss_fn(pred, y)` (PyTorch's quickstart) and
    `outputs = model(**batch)` keep it (True), or it is dropped once the
    loss exists (False: `loss_fn(model(x), y).backward()`, memfit.Trainer,
    a Lightning training_step's locals). See Note [The order of a training
    iteration] (report.h)."""

    set_to_none: bool = True
    accumulation_steps: int = 1
    zero_grad: str = "after_step"
    train_mode: bool = True
    keep_output: bool = True

    @property
    def zero_grad_first(self) -> bool:
        return self.zero_grad == "before_backward"

    def note(self) -> str | None:
        """What a report of this loop says about it, or None for torch's
        quickstart loop."""
        parts = []
        if self.accumulation_steps > 1:
            parts.append(f"{self.accumulation_steps} accumulated micro-batches per optimizer "
                         f"step (the gradients alive through the later ones' forward)")
        if not self.set_to_none:
            parts.append("zero_grad in place (set_to_none=False): the gradients stay alive "
                         "through the next iteration, as between the micro-batches of an "
                         "accumulated step")
        if self.zero_grad_first:
            parts.append("zero_grad just before backward (the last step's gradients alive "
                         "through the forward)")
        if not self.keep_output:
            parts.append("the model's output dropped once the loss exists (keep_output=False)")
        return "the loop: " + "; ".join(parts) if parts else None

    def profile_args(self) -> dict:
        """memfit.profile's keyword arguments for this loop: its fields are
        named as profile's."""
        return dataclasses.asdict(self)


def kept_output_note(output_bytes: int, batch: int) -> str:
    """What a report or an answer of a loop that keeps the model's output
    (Loop.keep_output) says of it, where it matters (1% or more). Up to:
    what the loss's backward holds anyway (features it reads) is at the
    peak either way. See Note [What a kept output holds] (record.py)."""
    return (f"the model's output ({format_bytes(output_bytes)} at batch {batch}) stays alive "
            f"until the next forward, as `pred = model(x); loss = loss_fn(pred, y)` keeps it; "
            f"a loop that drops it once the loss exists (loss_fn(model(x), y).backward()) "
            f"needs up to that much less: pass keep_output=False")


def as_loop(set_to_none: bool = True, accumulation_steps: int = 1,
            zero_grad: str = "after_step", train_mode: bool = True,
            what: str = "profile", keep_output: bool = True) -> Loop:
    """The Loop of the user's arguments, each checked with a one-line
    ValueError tagged `what`."""
    for name, value in (("set_to_none", set_to_none), ("train_mode", train_mode),
                        ("keep_output", keep_output)):
        if not isinstance(value, bool):
            raise ValueError(f"[{what}] {name} must be True or False, got {value!r}")
    if (isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int)
            or accumulation_steps < 1):
        raise ValueError(f"[{what}] accumulation_steps must be an int >= 1 (micro-batches per "
                         f"optimizer step), got {accumulation_steps!r}")
    if zero_grad not in ZERO_GRAD_PLACES:
        raise ValueError(f"[{what}] zero_grad must be one of {list(ZERO_GRAD_PLACES)} (where "
                         f"your loop calls optimizer.zero_grad()), got {zero_grad!r}")
    return Loop(set_to_none, accumulation_steps, zero_grad, train_mode, keep_output)


def eval_modules(model: torch.nn.Module) -> int:
    """How many of `model`'s modules are in eval mode."""
    return sum(1 for m in model.modules() if not m.training)


@contextlib.contextmanager
def train_mode(model: torch.nn.Module, on: bool = True):
    """A block in which `model` is in train mode (when `on`); each module's
    own flag is put back afterwards. Yields the number of modules that were
    in eval mode and were switched."""
    modes = [(m, m.training) for m in model.modules()]
    switched = eval_modules(model) if on else 0
    if switched:
        model.train()
    try:
        yield switched
    finally:
        if switched:
            for m, training in modes:
                m.training = training
