"""The settings people choose between to fine-tune an HF causal LM (bf16
weights, Adafactor, SGD, HF gradient checkpointing, LoRA via peft), as
memfit.advise's rows: each a change to a copy of the user's model and its
optimizer, handed to the core planner as a named setting (See Note [How
advise plans], src/core/advise_plan.cpp). The user's model is never changed.

Not settings here: autocast (torch.autocast has no meta dispatch, and the
CPU's bf16 autocast is advise's own "autocast bf16" row), 8-bit Adam
(bitsandbytes needs CUDA)."""

import copy
import dataclasses
from typing import Callable

import torch

from ..._step.offload import OffloadedOptimizer, construct, offload

__all__ = [
    "LORA_RANKS", "LORA_MODULES", "Setting", "is_causal_lm", "trainable", "user_optimizer_on",
    "materialize", "llm_settings",
]

LORA_RANKS = (64, 16, 8)  # the plan tries the largest rank first
LORA_MODULES = ("q_proj", "v_proj")


@dataclasses.dataclass(frozen=True)
class Setting:
    """A change to the model or its optimizer that advise records as a row
    and the plan may use (exact ones always; the others with
    allow_approximate).

    apply(model) changes `model` (a copy of the user's) and returns the
    model to train (itself or a wrapper, as peft's). optimizer(model, user)
    returns what memfit.profile takes as the optimizer of the changed model;
    None: the user's optimizer rebuilt on it. checkpoints: the setting
    checkpoints the model itself (the planner adds none of its own)."""

    label: str
    apply: Callable
    optimizer: Callable = None
    exact: bool = False
    checkpoints: bool = False


def is_causal_lm(model):
    """A transformers PreTrainedModel for causal language modelling (its
    class named *ForCausalLM), told without importing transformers."""
    names = [c.__name__ for c in type(model).__mro__]
    return ("PreTrainedModel" in names and hasattr(model, "config")
            and "ForCausalLM" in type(model).__name__)


def trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def user_optimizer_on(model, optimizer):
    """The user's optimizer (a name, an Optimizer, an OffloadedOptimizer or
    None) for `model`: a name stays a name; an instance is rebuilt, with its
    class and its first group's hyperparameters, over `model`'s trainable
    parameters."""
    if optimizer is None or isinstance(optimizer, str):
        return optimizer
    if isinstance(optimizer, OffloadedOptimizer):
        return offload(user_optimizer_on(model, optimizer.inner))
    group = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    return construct(type(optimizer), [dict(group, params=trainable(model))],
                     optimizer.defaults)


def materialize(model, setting):
    """A copy of `model` with `setting` applied, and the path of the copy
    of `model` inside it ("" for itself; a wrapper such as peft's puts it
    under a prefix, "base_model.model"). On the meta device the copy holds
    no memory; on a real device it costs a copy of the weights."""
    inner = copy.deepcopy(model)
    changed = setting.apply(inner)
    prefix = next(name for name, m in changed.named_modules() if m is inner)
    return changed, prefix


def _to_bf16(model):
    return model.to(torch.bfloat16)


def _hf_checkpointing(model):
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _lora(rank, modules, to_bf16):
    def apply(model):
        import peft

        if to_bf16:
            model = _to_bf16(model)
        return peft.get_peft_model(model, peft.LoraConfig(r=rank, target_modules=list(modules)))

    return apply


def _adafactor(model, user):
    return torch.optim.Adafactor(trainable(model))


def _sgd(model, user):
    return torch.optim.SGD(trainable(model), lr=1e-3)


def llm_settings(model):
    """The settings advise proposes for an HF causal LM, in the order the
    plan tries them, and notes on what it leaves out. [] for other models."""
    if not is_causal_lm(model):
        return [], []
    notes = []
    settings = []
    if getattr(model, "supports_gradient_checkpointing", False):
        settings.append(Setting("HF gradient checkpointing", _hf_checkpointing, exact=True,
                                checkpoints=True))
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    to_bf16 = torch.float32 in dtypes
    pre = "bf16 weights, " if to_bf16 else ""
    if to_bf16:
        settings.append(Setting("bf16 weights", _to_bf16))
    bf16 = _to_bf16 if to_bf16 else (lambda m: m)
    settings.append(Setting(pre + "Adafactor", bf16, _adafactor))
    settings.append(Setting(pre + "SGD", bf16, _sgd))
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    try:
        import peft  # noqa: F401
    except ImportError:
        notes.append("LoRA: peft does not import (pip install peft): no LoRA rows")
    else:
        if all(m in names for m in LORA_MODULES):
            for r in LORA_RANKS:
                settings.append(Setting(f"{pre}LoRA r={r} ({', '.join(LORA_MODULES)})",
                                        _lora(r, LORA_MODULES, to_bf16)))
        else:
            notes.append(f"LoRA: the model has no {' and '.join(LORA_MODULES)} modules: "
                         f"no LoRA rows")
    notes.append("8-bit Adam: not a row (bitsandbytes needs CUDA)")
    notes.append(f"settings ({'; '.join(st.label for st in settings)}): each recorded on a "
                 f"copy of the model"
                 + ("" if all(p.is_meta for p in model.parameters())
                    else ", which costs a copy of its weights in memory"))
    return settings, notes
