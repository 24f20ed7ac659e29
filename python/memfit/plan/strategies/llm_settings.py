"""The settings people choose between to fine-tune an HF causal LM (bf16
weights, 8-bit AdamW, Adafactor, SGD, HF gradient checkpointing, LoRA via
peft, 4-bit QLoRA, the chunked loss head), as
memfit.advise's rows: each a change to a copy of the user's model and its
optimizer, handed to the core planner as a named setting (See Note [How
advise plans], src/core/plan/advise_plan.cpp). The user's model is never changed.

Not settings here: autocast (torch.autocast has no meta dispatch, and the
CPU's bf16 autocast is advise's own "autocast bf16" row), paged optimizers
(CUDA unified memory; See Note [Why torchao, not bitsandbytes])."""

import contextlib
import copy
import dataclasses
from typing import Callable

import torch

from ..._step.offload import OffloadedOptimizer, construct
from ...memory.offload import offload
from .chunked_loss import apply_chunked_loss, chunk_tokens_for, has_linear_head
from .quantized import QLORA_MODULES, adamw8bit, quantizable, to_nf4_linears, torchao_available

__all__ = [
    "LORA_RANKS", "LORA_MODULES", "QLORA_RANK", "Setting", "is_causal_lm", "trainable", "user_optimizer_on",
    "materialize", "copy_changed", "llm_settings", "kv_cache_bytes", "kv_cache_notes",
]

LORA_RANKS = (64, 16, 8)  # the plan tries the largest rank first
LORA_MODULES = ("q_proj", "v_proj")
QLORA_RANK = 16  # QLoRA's adapters: r=16 on every projection (Unsloth's default)


@dataclasses.dataclass(frozen=True)
class Setting:
    """A change to the model or its optimizer that advise records as a row
    and the plan may use (exact ones always; the others with
    allow_approximate).

    apply(model) changes `model` (a copy of the user's) and returns the
    model to train (itself or a wrapper, as peft's). optimizer(model, user)
    returns what memfit.profile takes as the optimizer of the changed model;
    None: the user's optimizer rebuilt on it. checkpoints: the setting
    checkpoints the model itself (the planner adds none of its own).

    base and extra: how advise may record the setting on another setting's
    copy instead of a copy of its own (See Note [Settings that share a
    copy]): `apply` is `base` followed by `extra(model)`, which changes the
    copy of the user's model (under a wrapper too) and returns a function
    that undoes the change."""

    label: str
    apply: Callable
    optimizer: Callable = None
    exact: bool = False
    checkpoints: bool = False
    base: Callable = None
    extra: Callable = None


# Note [Settings that share a copy]
# Each setting is recorded on a copy of the user's model changed by its
# apply(). On an 8B Llama on meta, QLoRA's copy takes 0.8 s to make (NF4
# weights and 224 adapters), and "QLoRA, chunked loss" made the same copy
# again and put the chunked loss on it. A setting whose apply is another's
# followed by a change that can be undone says so (base, extra): advise
# records it on the other's copy, with the change made for each of its
# recordings and undone after. `apply` stays the whole change: it is what
# the user applies (Advice.setting(label).apply) and what materialize()
# makes.


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
    return copy_changed(model, setting.apply)


def copy_changed(model, apply):
    """A copy of `model` changed by apply(copy), and the path of the copy
    inside what apply returned, as materialize()."""
    inner = copy.deepcopy(model)
    changed = apply(inner)
    prefix = next(name for name, m in changed.named_modules() if m is inner)
    return changed, prefix


def _token_ids(inputs):
    """The batch's token ids (input_ids of a dict, or a 2-D integer tensor), or None."""
    ids = inputs.get("input_ids") if isinstance(inputs, dict) else inputs
    if (isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point()
            and not ids.is_complex()):
        return ids
    return None


def kv_cache_bytes(model, inputs, batch=None, training=True):
    """Bytes of the KV cache a forward of the HF causal LM `model` (or the
    one a PEFT wrapper holds) keeps on `inputs` (at `batch` samples of it;
    None: all): every layer's keys and values, in the dtype of its hidden
    states (its input embeddings'; advise's bf16 autocast hands its outputs
    back in fp32). 0 when its config has use_cache=False, or when HF
    gradient checkpointing turns the cache off in training; None when the
    tokens or the config cannot be read."""
    base = getattr(model, "get_base_model", None)
    if callable(base) and not is_causal_lm(model):
        model = base()
    cfg = getattr(model, "config", None)
    if not is_causal_lm(model) or not getattr(cfg, "use_cache", False):
        return 0
    if training and getattr(model, "is_gradient_checkpointing", False):
        return 0  # HF sets use_cache=False under its checkpointing in training
    ids = _token_ids(inputs)
    heads = getattr(cfg, "num_attention_heads", None)
    layers = getattr(cfg, "num_hidden_layers", None)
    if ids is None or not heads or not layers:
        return None
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    embed = model.get_input_embeddings()
    item = embed.weight.element_size() if embed is not None else 4
    samples = ids.shape[0] if batch is None else batch
    return layers * 2 * samples * ids.shape[1] * kv * head_dim * item


def kv_cache_notes(model, inputs):
    """A note when the HF causal LM `model` keeps a KV cache in training
    (its config's use_cache, True in Llama-3's own): every layer's keys and
    values, alive with the output, at the batch's tokens (from its
    input_ids) when they can be read. [] otherwise."""
    n = kv_cache_bytes(model, inputs)
    if n == 0:
        return []
    size = ""
    if n is not None:
        from ..._native import format_bytes
        ids = _token_ids(inputs)
        size = (f" of {format_bytes(n)} at {ids.shape[0]} x {ids.shape[1]} tokens (every "
                f"layer's keys and values; each row's kv_cache_bytes)")
    return [f"the model's config has use_cache=True: a training forward keeps a KV cache{size}, "
            f"alive with the output, in every row that does not turn it off; train with "
            f"model.config.use_cache = False"]


def _check_causal_lm(model, peft_ok=False):
    """Refuses, in one line, a model a setting cannot change: not an HF
    causal LM, or (peft_ok False) one a PEFT wrapper already holds."""
    if _is_peft(model):
        if peft_ok:
            return
        raise ValueError(
            f"[Setting.apply] the model is already a PEFT model ({type(model).__name__}): "
            f"apply the setting to the model advise was given, once (or call "
            f"advice.apply_plan(model, optimizer) on that model)")
    if isinstance(model, torch.nn.Module) and isinstance(getattr(model, "_orig_mod", None),
                                                         torch.nn.Module):
        raise ValueError(
            f"[Setting.apply] {type(model._orig_mod).__name__} is compiled (torch.compile): "
            f"apply the setting to the model before compiling it (model._orig_mod), then "
            f"compile what it returns")
    if not is_causal_lm(model):
        raise TypeError(
            f"[Setting.apply] the settings change an HF causal LM (a transformers "
            f"*ForCausalLM, as advise was given), got {type(model).__name__}: apply it to "
            f"that model")


def _is_peft(model):
    return hasattr(model, "peft_config") and callable(getattr(model, "get_base_model", None))


def _to_bf16(model):
    _check_causal_lm(model, peft_ok=True)
    return model.to(torch.bfloat16)


def _same(model):
    """The model unchanged: the settings that change the optimizer only."""
    _check_causal_lm(model, peft_ok=True)
    return model


def _hf_checkpointing(model):
    _check_causal_lm(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _with_lora(model, rank, modules):
    """peft's LoRA wrapper of `model`. peft makes each adapter on the CPU,
    initializes it and moves it to its base layer's device: for a model on
    meta, an 8B Llama's QLoRA adapters were ~170 MB written on the host and
    dropped, 1-2 s a copy. There they are made under torch.device("meta"):
    the same adapters, on the device peft would move them to."""
    import peft

    on_meta = all(p.device.type == "meta" for p in model.parameters())
    with torch.device("meta") if on_meta else contextlib.nullcontext():
        return peft.get_peft_model(model, peft.LoraConfig(r=rank, target_modules=list(modules)))


def _lora(rank, modules, to_bf16):
    def apply(model):
        _check_causal_lm(model)
        if to_bf16:
            model = _to_bf16(model)
        return _with_lora(model, rank, modules)

    return apply


def _chunked(chunk, inner=None):
    def apply(model):
        _check_causal_lm(model)
        changed = inner(model) if inner is not None else model
        apply_chunked_loss(model, chunk)  # the HF model itself, under a peft wrapper too
        return changed

    return apply


def _chunked_extra(chunk):
    def extra(model):
        return apply_chunked_loss(model, chunk)  # returns its undo

    return extra


def _qlora(rank, modules):
    def apply(model):
        _check_causal_lm(model)
        model = _to_bf16(model)
        to_nf4_linears(model, modules)
        return _with_lora(model, rank, modules)

    return apply


def _adamw8bit(model, user):
    group = user.param_groups[0] if isinstance(user, torch.optim.Optimizer) else {}
    return adamw8bit(trainable(model), lr=group.get("lr", 1e-3),
                     weight_decay=group.get("weight_decay", 1e-2))


def _adafactor(model, user):
    return torch.optim.Adafactor(trainable(model))


def _sgd(model, user):
    return torch.optim.SGD(trainable(model), lr=1e-3)


def llm_settings(model, budget_bytes=None, tokens=None):
    """The settings advise proposes for an HF causal LM, in the order the
    plan tries them (closest to full fine-tuning first), and notes on what
    it leaves out. [] for other models. budget_bytes and tokens (a
    micro-batch's, at most) choose the chunked loss's chunk
    (chunk_tokens_for)."""
    if not is_causal_lm(model):
        return [], []
    notes = []
    settings = []
    if getattr(model, "supports_gradient_checkpointing", False):
        settings.append(Setting("HF gradient checkpointing", _hf_checkpointing, exact=True,
                                checkpoints=True))
    chunk = None
    if has_linear_head(model):
        vocab = model.get_output_embeddings().out_features
        chunk = chunk_tokens_for(budget_bytes, vocab, tokens)
        settings.append(Setting(f"chunked loss ({chunk} tokens a chunk)", _chunked(chunk),
                                exact=True))
    else:
        notes.append("chunked loss: the model's head is not an nn.Linear: no row")
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    to_bf16 = torch.float32 in dtypes
    pre = "bf16 weights, " if to_bf16 else ""
    if to_bf16:
        settings.append(Setting("bf16 weights", _to_bf16))
    bf16 = _to_bf16 if to_bf16 else _same
    ao = torchao_available()
    if ao:
        settings.append(Setting(pre + "AdamW 8-bit (torchao)", bf16, _adamw8bit))
    settings.append(Setting(pre + "Adafactor", bf16, _adafactor))
    settings.append(Setting(pre + "SGD", bf16, _sgd))
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    try:
        import peft  # noqa: F401
    except ImportError:
        notes.append("LoRA: peft does not import (pip install peft): no LoRA or QLoRA rows")
    else:
        if all(m in names for m in LORA_MODULES):
            for r in LORA_RANKS:
                settings.append(Setting(f"{pre}LoRA r={r} ({', '.join(LORA_MODULES)})",
                                        _lora(r, LORA_MODULES, to_bf16)))
        else:
            notes.append(f"LoRA: the model has no {' and '.join(LORA_MODULES)} modules: "
                         f"no LoRA rows")
        projections = sorted({path.rsplit(".", 1)[-1] for path, m in model.named_modules()
                              if path.rsplit(".", 1)[-1] in QLORA_MODULES
                              and isinstance(m, torch.nn.Linear)
                              and quantizable(m.weight.numel())},
                             key=QLORA_MODULES.index)
        if not ao:
            notes.append("QLoRA and 8-bit AdamW: torchao does not import (pip install "
                         "torchao==0.18.0): no rows")
        elif projections:
            label = f"QLoRA r={QLORA_RANK} (NF4 via torchao, {len(projections)} projections)"
            qlora = _qlora(QLORA_RANK, projections)
            settings.append(Setting(label, qlora))
            if chunk is not None:  # See Note [Settings that share a copy].
                settings.append(Setting(f"{label}, chunked loss ({chunk} tokens a chunk)",
                                        _chunked(chunk, qlora), base=qlora,
                                        extra=_chunked_extra(chunk)))
        else:
            notes.append(f"QLoRA: no projection ({', '.join(QLORA_MODULES)}) has a multiple "
                         f"of 64 x 256 weights, as torchao's NF4 needs: no QLoRA rows")
    notes.append("paged AdamW (bitsandbytes): not a row (its state pages through CUDA "
                 "unified memory: CUDA only)")
    notes.append(f"settings ({'; '.join(st.label for st in settings)}): each recorded on a "
                 f"copy of the model"
                 + ("" if all(p.is_meta for p in model.parameters())
                    else ", which costs a copy of its weights in memory"))
    return settings, notes
