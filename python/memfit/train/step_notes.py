"""What a split step computes differently from one eager step on the whole
batch, said in its StepReport's notes."""

from __future__ import annotations

import torch

__all__: list = []

# Note [Dropout in a split step]
# Dropout draws its mask from the RNG over the tensor it is given: a
# micro-batch of 16 draws 16 samples' masks. On CUDA each kernel draws from
# its own offset, so these are not the slice of the mask the whole batch of
# 64 would have drawn (GPT-2's default dropout: weights up to 0.82 relative
# apart after a step); on the CPU dropout happens to draw element by element
# and the masks come out the same, but torch.randn draws in blocks and a
# step that uses it does not. Each sample still gets one mask, from the same
# distribution, so the step is as valid a training step. Drawing the whole
# batch's masks and slicing them would need every random op's RNG
# consumption to follow the element order, which torch's kernels do not
# promise. So memfit says it: each split step's report names the dropout
# layers or, with none, says that the step drew random numbers (the
# generators moved: F.dropout, torch.randn_like, a stochastic-depth layer);
# an unsplit step, or the layers in eval mode (p = 0), are the same as eager.
#
# Note [What else a split step does per micro-batch]
# A forward runs once per micro-batch, so what it does besides computing
# the loss happens that many times, where one eager step does it once:
# - BatchNorm in training mode under coupled="allow" normalises each
#   micro-batch by its own statistics (the gradients are not the whole
#   batch's) and moves its running statistics once per micro-batch;
# - a forward that writes a buffer (a call counter, an EMA of its inputs, a
#   queue) writes it once per micro-batch, and each micro-batch's forward
#   reads what the ones before it wrote: the buffers' values after the step,
#   and the gradients where the forward reads them, differ from the eager
#   step's (an EMA the forward divides by: 0.16 relative).
# Neither can be made equal by splitting otherwise, so each is named in the
# step's report, with what makes the step equal to eager's.


def batchnorms(model):
    """(path, module) of each BatchNorm layer of `model`: the layers whose
    statistics mix a batch's samples (and whose buffers a forward writes)."""
    return [(path, m) for path, m in model.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def coupled_layers(model):
    """Paths of the layers that mix the samples of a batch in training mode
    (BatchNorm); splitting the batch changes what they compute."""
    return [path or type(m).__name__ for path, m in batchnorms(model) if m.training]


def _shown(names):
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _dropout_p(m):
    """The dropout probability of a dropout layer or MultiheadAttention, else
    None."""
    if isinstance(m, torch.nn.modules.dropout._DropoutNd):
        return m.p
    if isinstance(m, torch.nn.MultiheadAttention):
        return m.dropout
    return None


def random_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The layers of `model` that draw random masks now: in training mode,
    dropout with p > 0 (MultiheadAttention's too)."""
    return [m for _, m in _random_named(model)]


def _random_named(model):
    return [(path, m) for path, m in model.named_modules()
            if m.training and (_dropout_p(m) or 0) > 0]


def random_layers(model: torch.nn.Module) -> list[str]:
    """Paths of the layers that draw random masks in training mode (dropout
    with p > 0, MultiheadAttention's dropout)."""
    return [f"{path or type(m).__name__} ({type(m).__name__}, p={_dropout_p(m):g})"
            for path, m in _random_named(model)]


def split_notes(model: torch.nn.Module, micro_batches: int, drew_random: bool = False,
                written: tuple = ()) -> list[str]:
    """The notes of a step that ran in `micro_batches` micro-batches: see
    Note [Dropout in a split step] and Note [What else a split step does
    per micro-batch]. drew_random: whether the step moved the generators;
    written: the buffers the step wrote, BatchNorm's left out."""
    if micro_batches < 2:
        return []
    notes = []
    layers = random_layers(model)
    if layers:
        notes.append(
            f"dropout drew its masks per micro-batch ({micro_batches} of them), not once for "
            f"the whole batch: each sample got one mask, but not necessarily the one an eager "
            f"step on the whole batch would draw (on CUDA it is not), so the gradients may "
            f"differ from that step's; layers: "
            f"{_shown(layers)}. For a step equal to eager's, put them in eval mode or set p=0")
    elif drew_random:
        notes.append(
            f"the step drew random numbers per micro-batch ({micro_batches} of them: "
            f"F.dropout, torch.randn_like, a stochastic-depth layer), not once for the whole "
            f"batch: each sample got its own draw, but not necessarily the one an eager step on "
            f"the whole batch would make (torch.randn draws in blocks; on CUDA each kernel from "
            f"its own offset), so the gradients may differ from that step's. For a step equal "
            f"to eager's, turn the randomness off (eval mode, p=0)")
    coupled = coupled_layers(model)
    if coupled:
        notes.append(
            f"BatchNorm normalised each of the {micro_batches} micro-batches by its own "
            f"statistics (coupled='allow'), not by the whole batch's: the gradients differ from "
            f"one eager step on the whole batch, and the running statistics moved "
            f"{micro_batches} times, not once; layers: {_shown(coupled)}. For a step equal to "
            f"eager's, put them in eval mode, replace them (GroupNorm, LayerNorm), or run the "
            f"batch whole (a larger budget)")
    if written:
        notes.append(
            f"the forward wrote buffers in each of the {micro_batches} micro-batches, where one "
            f"eager step on the whole batch writes them once: their values after the step "
            f"differ from that step's, and each forward read what the micro-batches before it "
            f"wrote (the gradients differ where it uses them); buffers: {_shown(list(written))}. "
            f"For a step equal to eager's, run the batch whole (a larger budget), or put their "
            f"modules in eval mode where they only gather statistics")
    return notes
