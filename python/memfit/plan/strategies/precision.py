"""bf16 autocast on the CPU: the model's forward runs its matmuls and
convolutions in bfloat16 (approximate: changes the numbers)."""

import contextlib

import torch

from ..._step.batching import map_tensors
from .checkpoint import override_forward

__all__ = ["autocast_bf16"]


def _to_float32(t):
    return t.float() if t.dtype == torch.bfloat16 else t


def _outputs_to_float32(out):
    if isinstance(out, dict) and type(out) is not dict:
        # A dict's subclass (HF's ModelOutput) stays its class: the loss may
        # read out.logits.
        try:
            return type(out)(**{k: map_tensors(v, _to_float32) for k, v in out.items()})
        except TypeError:
            pass
    return map_tensors(out, _to_float32)


def _autocast_forward(forward):
    def run(*args, **kwargs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = forward(*args, **kwargs)
        # The loss runs outside autocast, as in the plain step.
        return _outputs_to_float32(out)

    return run


@contextlib.contextmanager
def autocast_bf16(model):
    """`model`'s forward under torch.autocast("cpu", dtype=torch.bfloat16)
    inside the block; bfloat16 outputs come back as float32."""
    with override_forward(model, _autocast_forward):
        yield model
