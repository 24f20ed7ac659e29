"""The strategies memfit.advise measures, each a change to a training step
that lowers its memory: activation checkpointing over a chain of blocks,
bf16 autocast, a lighter optimizer, the optimizer's state on the host,
zero_grad in place, forward-only eval steps, and the settings of an LLM
(llm_settings: bf16 weights, Adafactor, LoRA ..., applied to a copy). One
module per strategy; `Strategy` names a combination and `applied()` puts
its model-side parts on a model and takes them off."""

import contextlib
import dataclasses

from .checkpoint import checkpointed, find_chain, resolve_chain
from .precision import autocast_bf16

TRAIN, NO_GRAD, INFERENCE_MODE = "train", "no_grad", "inference_mode"


@dataclasses.dataclass(frozen=True)
class Strategy:
    """One combination of strategies, as advise measures and applies it."""

    checkpoint: tuple = ()  # indices of the chain's blocks run under checkpoint
    autocast_bf16: bool = False
    zero_grad_in_place: bool = False  # zero_grad(set_to_none=False)
    optimizer: str = None  # None: the user's optimizer; else adam|momentum|sgd
    host_state: bool = False  # the optimizer's state and step on the host (memfit.offload)
    step: str = TRAIN  # train | no_grad | inference_mode (forward and loss only)
    setting: str = None  # None; else the label of a Setting, applied to a copy of the model
    setting_exact: bool = False  # the setting keeps what is trained

    @property
    def exact(self):
        """True when the step computes what the plain step computes."""
        return (not self.autocast_bf16 and self.optimizer is None
                and (self.setting is None or self.setting_exact))


@contextlib.contextmanager
def applied(model, strategy, block_paths):
    """`model` with the strategy's model-side parts (checkpointing the blocks
    at `block_paths`[i] for i in strategy.checkpoint, bf16 autocast) for the
    duration of the block; the original forwards come back after it. A
    setting is not applied here: advise records it on a copy of the model
    it made (llm_settings.materialize)."""
    with contextlib.ExitStack() as stack:
        if strategy.checkpoint:
            blocks = [model.get_submodule(block_paths[i]) for i in strategy.checkpoint]
            stack.enter_context(checkpointed(blocks))
        if strategy.autocast_bf16:
            stack.enter_context(autocast_bf16(model))
        yield model


__all__ = [
    "applied",
    "autocast_bf16",
    "checkpointed",
    "find_chain",
    "resolve_chain",
    "Strategy",
    "INFERENCE_MODE",
    "NO_GRAD",
    "TRAIN",
]
