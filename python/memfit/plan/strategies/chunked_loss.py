"""A linear head and cross-entropy computed in chunks of tokens, so the
whole logits never exist: each chunk's logits are computed, its loss taken,
and in backward its logits recomputed for its gradient.

Note [Chunked linear cross-entropy]: the logits of a causal LM are tokens x
vocabulary; Llama-3-8B at 4 x 4096 tokens and a vocabulary of 128,256 holds
a 3.9 GiB bf16 copy, its 7.8 GiB fp32 upcast (HF's loss upcasts), the fp32
log-softmax and the fp32 gradient: they dominate a step that is not split
into micro-batches. Liger's fused linear-cross-entropy and Apple's Cut
Cross-Entropy avoid them. Here, in plain PyTorch: forward keeps only the
hidden states (the head's input, already saved by the head's matmul in the
plain step) and one fp32 scalar; each chunk's logits live for one chunk.
Backward recomputes a chunk's logits (one extra head matmul, the time the
row costs), turns them into softmax - onehot in place, and accumulates the
hidden states' and the head's gradients. The result is the plain loss's in
exact arithmetic: per token, logsumexp(z) - z[target] is what
cross_entropy computes; the sum over tokens is split into chunks. In
floating point, fp64 agrees within 1e-6 relative and fp32 within a few ulps
of the sum (python/tests/test_llm_chunked_loss.py argues bf16).
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
import torch.nn.functional as F

__all__ = ["chunked_linear_cross_entropy", "chunked_loss"]

IGNORE_INDEX = -100  # HF's and torch's default ignore_index


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Sum over tokens of cross_entropy(hidden @ weight.T + bias, target) in
    fp32, computed `chunk` tokens at a time; targets equal to ignore_index
    add nothing."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, chunk, ignore_index):
        total = torch.zeros((), dtype=torch.float32 if hidden.dtype != torch.float64
                            else torch.float64, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            h = hidden[start:start + chunk]
            t = target[start:start + chunk]
            z = F.linear(h, weight, bias).to(total.dtype)  # HF upcasts the logits
            valid = t != ignore_index
            picked = z.gather(1, torch.where(valid, t, 0).unsqueeze(1)).squeeze(1)
            lse = torch.logsumexp(z, dim=1)
            del z
            total += ((lse - picked) * valid).sum()
        ctx.save_for_backward(hidden, weight, bias, target)
        ctx.chunk = chunk
        ctx.ignore_index = ignore_index
        return total

    @staticmethod
    def backward(ctx, grad_total):
        hidden, weight, bias, target = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = torch.zeros_like(bias) if need_b and bias is not None else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            h = hidden[start:start + ctx.chunk]
            t = target[start:start + ctx.chunk]
            z = F.linear(h, weight, bias).to(grad_total.dtype)
            valid = t != ctx.ignore_index
            # d(lse - z[t])/dz = softmax(z) - onehot(t), in place over z.
            z.sub_(torch.logsumexp(z, dim=1, keepdim=True)).exp_()
            z.scatter_add_(1, torch.where(valid, t, 0).unsqueeze(1),
                           torch.full_like(z[:, :1], -1.0))
            z.mul_((valid.to(z.dtype) * grad_total).unsqueeze(1))
            dz = z.to(weight.dtype)
            del z
            if need_h:
                torch.mm(dz, weight, out=grad_h[start:start + ctx.chunk])
            if need_w:
                grad_w.addmm_(dz.t(), h)
            if grad_b is not None:
                grad_b += dz.sum(0)
        return grad_h, grad_w, grad_b, None, None, None


def chunked_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor,
                                 target: torch.Tensor, bias: torch.Tensor | None = None,
                                 chunk_tokens: int = 1024, ignore_index: int = IGNORE_INDEX,
                                 reduction: str = "mean",
                                 num_items: torch.Tensor | int | None = None) -> torch.Tensor:
    """cross_entropy(F.linear(hidden, weight, bias).float(), target) with
    the logits computed `chunk_tokens` tokens at a time (See Note [Chunked
    linear cross-entropy]). hidden: (..., H), target: (...) of class
    indices, ignore_index skipped. reduction: "mean" (over the targets that
    are not ignored), "sum"; num_items: divide the sum by it instead (HF's
    num_items_in_batch). The loss is fp32 (fp64 for fp64 inputs)."""
    what = "chunked_linear_cross_entropy"
    chunk_tokens = _positive_int(chunk_tokens, what)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"[{what}] ignore_index must be an int (the target that adds nothing; "
                        f"{IGNORE_INDEX} by default), got {type(ignore_index).__name__} "
                        f"{ignore_index!r}")
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise TypeError(f"[{what}] target must hold class indices, an integer tensor, got "
                        f"{target.dtype}: pass target.long()")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"[chunked_linear_cross_entropy] reduction must be 'mean' or 'sum', "
                         f"got {reduction!r}")
    h = hidden.reshape(-1, hidden.shape[-1])
    t = target.reshape(-1).to(device=h.device, dtype=torch.long)
    if t.shape[0] != h.shape[0]:
        raise ValueError(f"[chunked_linear_cross_entropy] {h.shape[0]} tokens of hidden states "
                         f"but {t.shape[0]} targets: give one target per token")
    if weight.dim() != 2 or weight.shape[1] != h.shape[1]:
        raise ValueError(f"[{what}] hidden states of {h.shape[1]} features but a head weight of "
                         f"shape {tuple(weight.shape)}: give the head's weight, classes x "
                         f"features (nn.Linear's)")
    if t.device.type != "meta" and t.numel():
        classes = weight.shape[0]
        bad = (t != ignore_index) & ((t < 0) | (t >= classes))
        if bad.any():
            i = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"[{what}] target {int(t[i])} (token {i}) is not a class of the head's "
                f"{classes} (0..{classes - 1}) nor ignore_index {ignore_index}: check the "
                f"labels against the vocabulary")
    total = _ChunkedLinearCrossEntropy.apply(h, weight, bias, t, int(chunk_tokens),
                                             ignore_index)
    if num_items is not None:
        if torch.is_tensor(num_items):
            num_items = num_items.to(total.device)
        return total / num_items
    if reduction == "sum":
        return total
    return total / (t != ignore_index).sum()  # nan when every target is ignored, as torch's


def _positive_int(n, what):
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise (ValueError if isinstance(n, int) and not isinstance(n, bool) else TypeError)(
            f"[{what}] chunk_tokens must be a positive int (tokens per chunk), got "
            f"{type(n).__name__} {n!r}")
    return n


def chunk_tokens_for(budget_bytes: int | None, vocab_size: int, tokens: int | None = None,
                     default: int = 1024) -> int:
    """The chunk, in tokens, for a budget: the largest power of two (64 at
    least) whose fp32 logits and their three working copies (16 bytes a
    logit) take at most 1/16 of the budget, and no more than `tokens`.
    No budget: `default`."""
    if budget_bytes is None or budget_bytes <= 0:
        c = default
    else:
        fit = budget_bytes // (16 * 16 * max(1, vocab_size))
        c = 1 << max(6, int(math.log2(max(1, fit))))
    if tokens is not None:
        c = min(c, max(1, tokens))
    return c


def _head_of(model):
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else getattr(model, "lm_head", None)
    return head if isinstance(head, torch.nn.Linear) else None


def has_linear_head(model: torch.nn.Module) -> bool:
    """Whether chunked_loss applies to `model`: an HF model whose output
    embeddings (lm_head) are an nn.Linear and whose forward takes labels."""
    return _head_of(model) is not None and hasattr(type(model), "loss_function")


def _is_hf_causal(model):
    return any(c.__name__ == "PreTrainedModel" for c in type(model).__mro__)


@contextlib.contextmanager
def chunked_loss(model: torch.nn.Module, chunk_tokens: int = 1024) -> Iterator[torch.nn.Module]:
    """An HF causal LM (LlamaForCausalLM, GPT2LMHeadModel, ...) whose loss,
    when the forward is given labels, is computed by
    chunked_linear_cross_entropy from the last hidden states: the logits are
    never materialised whole, and out.logits is None. Without labels the
    model runs as before. The loss is HF's ForCausalLMLoss (labels shifted
    by one, -100 ignored, mean or sum / num_items_in_batch); gradients equal
    the plain loss's. For a `with` block; chunked_loss.apply(model, ...)
    changes the model for good (a copy memfit trains, or your own)."""
    undo = apply_chunked_loss(model, chunk_tokens)
    try:
        yield model
    finally:
        undo()


def apply_chunked_loss(model: torch.nn.Module, chunk_tokens: int = 1024):
    """Puts the chunked loss on `model` (See chunked_loss); returns a
    function that takes it off."""
    chunk_tokens = _positive_int(chunk_tokens, "chunked_loss")
    if type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod"):
        raise ValueError(
            f"[chunked_loss] {type(model._orig_mod).__name__} is compiled (torch.compile): put "
            f"the chunked loss on the model before compiling it (model._orig_mod), then "
            f"compile that")
    base = getattr(model, "get_base_model", None)
    if callable(base) and not _is_hf_causal(model):
        # A PEFT model: its forward hands the labels to the HF model it wraps.
        model = base()
    head = _head_of(model)
    if head is None or not _is_hf_causal(model):
        raise ValueError(
            f"[chunked_loss] {type(model).__name__} has no nn.Linear lm_head feeding HF's loss: "
            f"call memfit.chunked_linear_cross_entropy(hidden, head.weight, target) in your own "
            f"loss instead")
    state = {"labels": False}
    forward = model.forward

    def head_forward(hidden):
        # With labels, the "logits" handed to the loss are the hidden states.
        return hidden if state["labels"] else F.linear(hidden, head.weight, head.bias)

    def loss_function(logits, labels, vocab_size=None, num_items_in_batch=None,
                      ignore_index=IGNORE_INDEX, shift_labels=None, **kwargs):
        if shift_labels is None:  # tokens < n predict n, as ForCausalLMLoss
            labels = F.pad(labels, (0, 1), value=ignore_index)
            shift_labels = labels[..., 1:]
        return chunked_linear_cross_entropy(
            logits, head.weight, shift_labels, head.bias, chunk_tokens, ignore_index,
            num_items=num_items_in_batch)

    def chunked_forward(*args, **kwargs):
        state["labels"] = kwargs.get("labels") is not None
        try:
            out = forward(*args, **kwargs)
        finally:
            was, state["labels"] = state["labels"], False
        if was and hasattr(out, "logits"):
            out.logits = None
        return out

    # What was there before, put back by undo: a chunked loss already on
    # (an outer `with`) stays on when an inner one ends.
    missing = object()
    before = [(obj, name, obj.__dict__.get(name, missing))
              for obj, name in ((model, "forward"), (head, "forward"), (model, "_loss_function"))]
    model.forward = chunked_forward
    head.forward = head_forward
    model.loss_function = loss_function

    def undo():
        for obj, name, value in before:
            if value is missing:
                obj.__dict__.pop(name, None)
            else:
                obj.__dict__[name] = value

    return undo
