"""What memfit reads of the training frameworks' wrappers, without importing
the frameworks: the torch optimizer inside accelerate's or Lightning's, and
accelerate's gradient accumulation steps."""

from __future__ import annotations

from typing import Any, Callable

import torch

from .optimizer_chain import chained

__all__: list = []

_WRAPPERS = ("accelerate.", "lightning.", "pytorch_lightning.")


def unwrapped_optimizer(optimizer: Any) -> Any:
    """The torch optimizer memfit steps: the one inside accelerate's
    AcceleratedOptimizer or Lightning's LightningOptimizer (its
    `.optimizer`), a list of optimizers as one (See Note [Several optimizers
    in one step], optimizer_chain.py); anything else as it is. memfit runs
    the rehearsal's optimizer step on it and puts its state back: the
    wrapper's step would skip it outside an accumulation's last
    micro-batch."""
    inner = getattr(optimizer, "optimizer", None)
    if type(optimizer).__module__.startswith(_WRAPPERS) and isinstance(inner, torch.optim.Optimizer):
        return inner
    return chained(optimizer)


def accumulation_setter(accelerator: Any, optimizer: Any) -> Callable[[int], None] | None:
    """A function setting accelerate's gradient_accumulation_steps: through
    `accelerator`, else through the state an accelerator.prepare()d
    optimizer shares with its accelerator; None without either."""
    if accelerator is not None:
        if not isinstance(getattr(type(accelerator), "gradient_accumulation_steps", None),
                          property):
            raise ValueError(
                f"[auto_batch_size] accelerator must be an accelerate.Accelerator, got "
                f"{type(accelerator).__name__}"
            )
        return lambda steps: setattr(accelerator, "gradient_accumulation_steps", steps)
    state = getattr(optimizer, "gradient_state", None)
    if type(optimizer).__module__.startswith("accelerate.") and hasattr(state, "plugin_kwargs"):
        # What Accelerator.gradient_accumulation_steps' setter does: the
        # GradientState is one state shared by every instance (accelerate 1.x).
        return lambda steps: state.plugin_kwargs.update({"num_steps": steps})
    return None
