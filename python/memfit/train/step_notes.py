"""What a split step computes differently from one eager step on the whole
batch, said in its StepReport's notes."""

from __future__ import annotations

import torch

__all__: list = []

# Note [Dropout in a split step]
# Dropout draws its mask from the RNG over the tensor it is given: a
# micro-batch of 16 draws 16 samples' masks, not the slice of the mask the
# whole batch of 64 would have drawn. Each sample still gets one mask, from
# the same distribution, so the step is as valid a training step, but its
# gradients differ from one eager step on the whole batch (GPT-2's default
# dropout: weights up to 0.82 relative apart after a step). Drawing the
# whole batch's masks and slicing them would need every random op's RNG
# consumption to follow the element order, which torch's CPU and CUDA
# kernels do not promise. So memfit says it: each split step's report
# names the layers; an unsplit step, or the layers in eval mode (p = 0),
# are the same as eager.


def random_layers(model: torch.nn.Module) -> list[str]:
    """Paths of the layers that draw random masks in training mode (dropout
    with p > 0, MultiheadAttention's dropout)."""
    out = []
    for path, m in model.named_modules():
        if not m.training:
            continue
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            p = m.p
        elif isinstance(m, torch.nn.MultiheadAttention):
            p = m.dropout
        else:
            continue
        if p > 0:
            out.append(f"{path or type(m).__name__} ({type(m).__name__}, p={p:g})")
    return out


def split_notes(model: torch.nn.Module, micro_batches: int) -> list[str]:
    """The notes of a step that ran in `micro_batches` micro-batches: see
    Note [Dropout in a split step]."""
    if micro_batches < 2:
        return []
    layers = random_layers(model)
    if not layers:
        return []
    shown = ", ".join(layers[:3]) + (f" and {len(layers) - 3} more" if len(layers) > 3 else "")
    return [
        f"dropout drew its masks per micro-batch ({micro_batches} of them), not once for the "
        f"whole batch: each sample got one mask, but not the one an eager step on the whole "
        f"batch would draw, so the gradients differ from that step's; layers: {shown}. For a "
        f"step equal to eager's, put them in eval mode or set p=0"
    ]
