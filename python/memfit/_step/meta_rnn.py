"""Recurrent layers in a meta-mode step: the CPU and a card run kernels of
their own for them, which the meta device does not size. See Note [What
meta mode cannot size in an RNN]."""

import os

import torch

from .._native import native as _memfit

__all__: list = []

# Note [What meta mode cannot size in an RNN]
# nn.LSTM, nn.GRU and nn.RNN call one op (aten::lstm, gru, rnn_tanh,
# rnn_relu) that picks its kernels by the device of its tensors
# (aten/src/ATen/native/RNN.cpp):
# - on the CPU, an LSTM in float32 (bfloat16 where oneDNN takes it) without
#   proj_size runs oneDNN's RNN, one mkldnn_rnn_layer per layer and
#   direction: its forward keeps a workspace for backward (every step's
#   gates and states, in oneDNN's layout and padding) and its kernels take
#   scratch and reordered weights inside; torch's meta kernel for
#   mkldnn_rnn_layer returns an empty workspace. The other RNNs (and the
#   LSTMs oneDNN does not take) run torch's cell loop, but with a layer's
#   input projection computed for the whole sequence at once and held
#   through the layer (FullLayer, `inputs.device().is_cpu()`).
# - on CUDA, cuDNN's _cudnn_rnn: a reserve buffer kept for backward and a
#   workspace inside the op, both sized by cuDNN itself
#   (cudnnGetRNNTempSpaceSizes) and known only on the card; torch's meta
#   kernel for _cudnn_rnn gives the reserve 0 bytes ("TODO").
# - on meta, neither: torch's cell loop step by step, each step's input
#   projection apart.
# A 2-layer LSTM (32 -> 128, 24 steps, batch 64, Adam) peaked at 16.24 MB on
# meta and 36.15 MB on the CPU (-55%); a GRU alike at -12%. So for a CPU
# target, a meta step with an RNN module is rehearsed on the CPU, whose
# figures are the target's own, where it can be: real tensors, and a host
# with HEADROOM times the meta peak free (the CPU's peak was up to 2.2x
# meta's). The first recording (the example batch) decides, and every
# batch after runs there too, one truth per report: a batch the host has
# not the room for (at the most bytes a sample took so far) is refused with
# a ValueError, not run into the host's out-of-memory killer. The notes say
# so and name the modules. Where it cannot be (a model or inputs on the
# meta device, a host without room) or for a CUDA target, meta's figures
# stand, and the notes name the modules and say the peak may be higher:
# unverified, as a meta answer is.

HEADROOM = 4  # free host memory, in meta peaks, for rehearsing on the CPU


def rnn_modules(model: torch.nn.Module) -> list:
    """'name (LSTM)' of each nn.RNN, nn.LSTM and nn.GRU in `model`, as the
    report names modules."""
    return [f"{name or '(model)'} ({type(m).__name__})" for name, m in model.named_modules()
            if isinstance(m, torch.nn.RNNBase)]


def free_host_bytes() -> int:
    """This host's free memory in bytes; 0 where it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def host_bytes_at(peaks: dict, batch: int) -> int:
    """The host bytes a CPU rehearsal at `batch` would take, from `peaks`
    (batch -> peak) recorded there: the line through the largest two
    batches (its slope at least 0), the largest's peak per sample with one;
    0 with none."""
    if not peaks:
        return 0
    points = sorted(peaks.items())
    n2, p2 = points[-1]
    if len(points) == 1:
        return int(p2 / n2 * batch)
    n1, p1 = points[-2]
    return int(p2 + max(0.0, (p2 - p1) / (n2 - n1)) * (batch - n2))


def _named(labels):
    """'a (LSTM) runs', 'a (LSTM), b (GRU) run': the first three named."""
    named = ", ".join(labels[:3]) + (f" and {len(labels) - 3} more" if len(labels) > 3 else "")
    return named + (" runs" if len(labels) == 1 else " run")


def on_cpu_note(labels: list) -> str:
    """The note of a meta step rehearsed on the CPU for its RNNs."""
    return (f"mode='meta' rehearsed this step on the CPU: {_named(labels)} the CPU's own RNN "
            f"kernels (oneDNN's LSTM keeps a workspace for backward; GRU and RNN "
            f"project a whole layer's inputs at once), which the meta device does not size "
            f"(meta came out up to 55% under); see Note [What meta mode cannot size in an RNN]")


def unsized_note(labels: list, target_device: str, why: str) -> str:
    """The note of a meta step whose RNNs' own kernels are not counted;
    `why` it stayed on meta (for a CPU target)."""
    if target_device == "cuda":
        kernels = ("cuDNN's RNN kernel on a card keeps a reserve buffer for backward and "
                   "takes a workspace, both sized by cuDNN (known only on the card)")
    else:
        kernels = ("the CPU's own RNN kernels keep more (oneDNN's LSTM workspace, a whole "
                   f"layer's input projection; meta came out up to 55% under), and {why}")
    return (f"unverified: {_named(labels)} kernels meta mode does not size: {kernels}; "
            f"meta recorded torch's step-by-step cell loop, so the peak may be higher; "
            f"see Note [What meta mode cannot size in an RNN]")


def peak_bytes(timeline: _memfit.Timeline) -> int:
    """The peak live bytes of a recorded step."""
    return timeline.peak().bytes if len(timeline) else 0
