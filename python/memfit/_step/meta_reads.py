"""Reading a value out of a meta tensor during a meta-mode step.

Note [Data-dependent reads on the meta device]: a meta tensor has a shape
and no values, so `.item()`, `bool(t)` and `if t.all():` have nothing to
read; torch raises "Tensor.item() cannot be called on meta tensors". Models
do it for checks that pick a faster path: transformers asks, on every
forward, whether all sequences are unpacked (`(mask[:, -1] == 0).all()`)
before it builds its attention mask. While meta mode runs the step, such a
read of a boolean answers True, the case every checked element holds (an
unpacked batch, a mask of ones), and the report's notes name each place it
happened, so the figures say which path they measured. A read of a number
inside a torch.optim optimizer (Adafactor's step count and norms) answers
1: there it scales the update and sizes nothing; the notes name it too.
Elsewhere a number (a length, a count) has no safe answer: it raises, one
line naming where, and meta mode falls back to the CPU as for a missing
meta kernel.

Note [Which attention kernel meta runs]: scaled_dot_product_attention asks
_fused_sdp_choice which kernel to run on the CPU and CUDA; on any other
device, meta included, it runs the math path, which materializes the attention weights (batch x heads x tokens x tokens,
saved for backward) where the CPU and CUDA run a fused kernel that saves
only its output and a log-sum-exp: +0.8% on a small Llama, ~0.5 GiB per
layer on a 7B at 2048 tokens. While meta mode runs the step,
torch.nn.functional.scaled_dot_product_attention asks the CPU's choice for
the same dtype, head size, mask, dropout and causality (on one-element
stand-ins of the tensors) and, where that is the fused flash kernel, runs
it on meta as the CPU does (a boolean mask made additive first), so the
step saves what the fused kernel saves. Other choices run as before.

While meta mode runs the step, torch's own C++ meta kernels answer the
ops a step runs most (elementwise, reductions, softmax, matmuls, cat), in
front of the Python ones torch registers over them: the same shapes,
dtypes and strides as a real device, ~100x faster a call. See Note
[Native meta kernels] in src/torch/native_meta.cpp.

Note [The optimizer a GPU would run]: torch.optim's Adam, AdamW, SGD, ...
left at foreach=None pick their implementation from the parameters' device:
on CUDA the foreach one (one _foreach_* op over all tensors at once, whose
temporaries are as large as all parameters: 1.0x P inside AdamW's step),
on the CPU and meta the per-tensor loop (temporaries of the largest tensor
only: 0.04x P on a 7B Llama, 25 GiB less). A step planned for
target_device="cuda", on meta or on the CPU, runs foreach, as the GPU
would, whether the optimizer is the user's (its groups' setting is put
back after) or named ("adam"); find_batch_size, advise and the Trainer
beside a card plan it so.
"""

import contextlib
import inspect
import os
import sys

import torch
import torch.nn.functional as F

from .._native import native as _memfit
from .host_reads import caller_site

__all__: list = []

_TORCH_DIR = os.path.dirname(torch.__file__)


def _frames():
    """(file name, line) of the frames calling this, innermost first."""
    f = sys._getframe(1)
    while f is not None:
        yield f.f_code.co_filename, f.f_lineno
        f = f.f_back


def _caller():
    """'file:line' of the innermost frame outside torch and memfit's
    watchers of reads, or '?'."""
    return caller_site(skip=(__file__,))


def _cpu_sdp_choice(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False):
    """The attention kernel the CPU would choose for tensors like these: See
    Note [Which attention kernel meta runs]."""

    def stand_in(t):
        if t is None:
            return None
        # heads kept: grouped-query attention is part of the choice
        shape = [1] * (t.dim() - 3) + [t.shape[-3], 1, t.shape[-1]] if t.dim() >= 3 else \
            [1] * (t.dim() - 1) + [t.shape[-1]]
        return torch.zeros(shape, dtype=t.dtype, device="cpu")

    return torch._fused_sdp_choice(stand_in(query), stand_in(key), stand_in(value),
                                   attn_mask=stand_in(attn_mask), dropout_p=dropout_p,
                                   is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


_FLASH = 1  # torch.nn.attention.SDPBackend.FLASH_ATTENTION


def _fused_on_meta(sdpa):
    """scaled_dot_product_attention running the CPU's fused flash kernel on
    meta tensors where the CPU would: See Note [Which attention kernel meta
    runs]."""

    def fused(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False):
        if not (query.is_meta and query.dim() == 4
                and _cpu_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal,
                                    scale, enable_gqa) == _FLASH):
            return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                        is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype,
                                    device=attn_mask.device).masked_fill_(
                                        attn_mask.logical_not(), float("-inf"))
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]

    return fused


def run_foreach(optimizer):
    """Sets `optimizer`'s param groups left at foreach=None (and not fused
    or differentiable) to run foreach, as torch does for CUDA parameters;
    returns the indices of the groups it set. See Note [The optimizer a GPU
    would run]."""
    chosen = []
    if isinstance(optimizer, torch.optim.Optimizer):
        chosen = [i for i, g in enumerate(optimizer.param_groups)
                  if "foreach" in g and g["foreach"] is None and not g.get("fused")
                  and not g.get("differentiable")]
    for i in chosen:
        optimizer.param_groups[i]["foreach"] = True
    return chosen


@contextlib.contextmanager
def foreach_as_on_cuda(optimizer):
    """While active, `optimizer` runs foreach as on CUDA parameters
    (run_foreach), put back after; yields whether any group did."""
    chosen = run_foreach(optimizer)
    try:
        yield bool(chosen)
    finally:
        # by index: a load_state_dict() inside gives the optimizer new groups
        for i in chosen:
            optimizer.param_groups[i]["foreach"] = None


_OPTIM_DIR = os.path.join(_TORCH_DIR, "optim") + os.sep
_OPTIM_DIR_NAME = "torch/optim/"


def _innermost_in(directory):
    """'file:line' of the innermost frame under `directory`, relative to
    it; None when no frame is."""
    for filename, line in _frames():
        if filename.startswith(directory):
            return f"{filename[len(directory):]}:{line}"
    return None


@contextlib.contextmanager
def _meta_kernel_over_torchs(name, fn):
    """fn as aten::name's Meta kernel while active, over the Python one torch
    registers (its _local_scalar_dense raises). Library.impl replaces that
    kernel by default from torch 2.13 and when asked (allow_override) in
    2.11; torch 2.4's impl has no such argument and refuses while torch's
    key is in torch.library._impls, so there the key is set aside for the
    registration. Either way torch's kernel, and its key, are back after:
    meta mode was unavailable as a whole on those torches before."""
    key = f"aten/{name}/Meta"
    impls = getattr(torch.library, "_impls", set())
    held = key in impls
    lib = torch.library.Library("aten", "IMPL")
    try:
        if "allow_override" in inspect.signature(lib.impl).parameters:
            lib.impl(name, fn, "Meta", allow_override=True)
        else:
            impls.discard(key)
            lib.impl(name, fn, "Meta")
        yield
    finally:
        lib._destroy()
        del lib  # its finalizer takes the key out of _impls again: put back after
        if held:
            impls.add(key)


class MetaReads:
    """Where reads of meta tensors were answered (file:line, in the order
    first seen), while answering() is active."""

    def __init__(self):
        self.sites = []

    @contextlib.contextmanager
    def answering(self):
        math_sdpa = F.scaled_dot_product_attention
        with _meta_kernel_over_torchs("_local_scalar_dense", self._read):
            F.scaled_dot_product_attention = _fused_on_meta(math_sdpa)
            try:
                with _memfit.NativeMetaKernels():
                    yield self
            finally:
                F.scaled_dot_product_attention = math_sdpa

    def _read(self, t):
        in_optimizer = None if t.dtype == torch.bool else _innermost_in(_OPTIM_DIR)
        if in_optimizer is not None:
            where = _OPTIM_DIR_NAME + in_optimizer
            if where not in self.sites:
                self.sites.append(where)
            return 1 if not (t.dtype.is_floating_point or t.dtype.is_complex) else 1.0
        site = _caller()
        if t.dtype != torch.bool:
            raise RuntimeError(
                f"[profile] the step reads a {t.dtype} value of a meta tensor at {site} "
                f"(.item(), int(), a data-dependent size): the meta device has shapes "
                f"without values; move that read out of the step, or profile with real "
                f"tensors (mode='cpu')")
        if site not in self.sites:
            self.sites.append(site)
        return True

    def note(self):
        """The report's note, or None when nothing was read."""
        if not self.sites:
            return None
        shown = ", ".join(self.sites[:3]) + (" ..." if len(self.sites) > 3 else "")
        return (f"meta tensors have no values: {len(self.sites)} read(s) of the step "
                f"answered (checks True, optimizer scalars 1) at {shown}; "
                f"see Note [Data-dependent reads on the meta device]")
