"""The note a profile carries when the step runs ops whose kernels hold a
workspace (convolutions): meta mode leaves it out, and a CPU run shows what
the CPU's kernels took (see Note [Workspace meta mode cannot see])."""

from __future__ import annotations

import torch

from .._native import native as _memfit

__all__: list = []

# Note [Workspace meta mode cannot see]
# A meta kernel allocates exactly the op's outputs. The CPU's convolution
# kernels (oneDNN, im2col) also allocate a workspace inside the op and free
# it before returning, and so does cuDNN on a GPU, each its own size: a
# conv net's peak in meta mode came out 17% under the CPU's (106.29 against
# 128.73 MiB). The report says so whenever the model has convolutions: in
# meta mode that the workspace is left out; in cpu mode how much the CPU's
# convolution ops held at once inside themselves, which a GPU's kernels
# size differently.


def convolution_layers(model: torch.nn.Module) -> int:
    """How many convolution layers (Conv1d/2d/3d and transposed) `model` has."""
    return sum(1 for m in model.modules() if isinstance(m, torch.nn.modules.conv._ConvNd))


def convolution_workspace_bytes(timeline: _memfit.Timeline) -> int:
    """The most bytes that convolution ops held at once inside themselves
    (allocated in the op and freed before it returned) in `timeline`."""
    inside, live, peak = {}, 0, 0
    for kind, nbytes, ident, _dev, category, _phase, _module, op in timeline.events():
        if kind == "alloc":
            if "conv" in op and category == "temporary":
                inside[ident] = nbytes
                live += nbytes
                peak = max(peak, live)
        elif ident in inside:
            live -= inside.pop(ident)
    return peak


def workspace_note(model: torch.nn.Module, mode: str, timeline: _memfit.Timeline) -> str:
    """The report's note on convolution workspace, or "" without
    convolutions."""
    layers = convolution_layers(model)
    if mode == "meta":
        if not layers:
            return ""
        return (f"meta mode leaves out convolution workspace: the {layers} convolution "
                f"layer{'s' if layers > 1 else ''} run kernels that hold a workspace inside the "
                f"op (oneDNN on the CPU, cuDNN on a GPU), not modelled on meta, so the real "
                f"peak is higher; mode='cpu' measures the CPU's")
    held = convolution_workspace_bytes(timeline)
    if not layers and not held:
        return ""
    return (f"the CPU's convolution kernels held up to {_memfit.format_bytes(held)} of "
            f"workspace inside their ops (temporaries, in these figures); meta mode leaves "
            f"it out, and a GPU's cuDNN sizes its own")
