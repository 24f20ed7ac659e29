"""memfit.length_surface: the peak of a step over the batch and the length,
from steps recorded at a few (batch, length) shapes, checked at shapes
outside them. The surface itself lives with the Report
(report/length_surface.py: profile(..., seq_dim=) predicts over the length
too); this is its front for a model and an example batch."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .._step.hints import Batch
from ..report.length_surface import HeldOut, LengthAxis, LengthSurface
from ..report.profile import profile

__all__: list = []


def length_surface(model: torch.nn.Module, inputs: Batch, target: Batch = None, *,
                   seq_dim: Any, lengths: Sequence[int], batches: Sequence[int] = (2, 4),
                   held_out: Sequence[tuple] | None = None, batch_dim: Any = 0,
                   **profile_kwargs: Any) -> LengthSurface:
    """The peak of `model`'s training step over batch and length: the step
    recorded at every (batch, length) of `batches` x `lengths`, the example
    cut or repeated along batch_dim and seq_dim (its target too where it has
    the length: token labels), each event modelled over both (see Note [The
    peak over batch and length], report/length_surface.py), then checked at
    `held_out` shapes, (batch, length) pairs recorded and predicted; by
    default one with batch and length both outside the probes:
    max(batches) + min(batches), half way between the two longest lengths.
    held_out=() skips the check (the notes say so). Other keyword arguments
    go to memfit.profile (loss_fn, optimizer, mode, step, ...). Three
    lengths or more fit the L^2 term of materialised attention; two leave it
    out, and the notes say so. profile(..., seq_dim=) then
    report.length_surface() is the same surface from a Report.

    Returns a LengthSurface: predict_peak_bytes(batch, length),
    max_batch(length, budget), held_out_error, text()."""
    arguments = dict(profile_kwargs, model=model, inputs=inputs, target=target,
                     batch_dim=batch_dim)
    axis = LengthAxis(profile, arguments, seq_dim, "length_surface")
    return axis.surface(lengths, batches, held_out)
