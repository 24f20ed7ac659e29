"""What memfit reads of the training frameworks' wrappers, without importing
the frameworks: the torch optimizer inside accelerate's or Lightning's,
accelerate's gradient accumulation steps, and a backward that must go
through Lightning Fabric."""

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


# Note [A backward that must go through Fabric]
# Lightning Fabric's module (fabric.setup(model)) under a precision or a
# strategy with a backward of its own (bf16-mixed, 16-mixed, DeepSpeed) hooks
# its outputs to raise unless the loss's backward is fabric.backward(loss).
# memfit runs the step's backward itself and holds no Fabric to run it
# through, so find_batch_size raised Fabric's "requires you to call
# fabric.backward(loss)" from inside memfit's rehearsal. The same step runs
# on the module Fabric wraps under Fabric's autocast, which is all such a
# precision adds to the step on one device: an MLP under bf16-mixed, 1936
# found there against 1952 for Fabric's own loop as plain steps.
def fabric_backward_refusal(error: BaseException, what: str) -> str | None:
    """One line for `error` where it is Fabric refusing a backward memfit
    ran (See Note [A backward that must go through Fabric]); else None."""
    if not isinstance(error, RuntimeError) or "fabric.backward(loss)" not in str(error):
        return None
    return (f"[{what}] the model was set up by Lightning Fabric, whose precision or strategy "
            f"needs fabric.backward(loss), and memfit runs the step's backward itself: give "
            f"memfit the module Fabric wraps (model.module) and call memfit under `with "
            f"fabric.autocast():`")
