"""memfit's prediction for a step (recorded on the CPU, target_device="cuda")
beside a snapshot of the same step on a card: allocated and reserved peaks,
in all and phase by phase.

Measured: the snapshot's allocated bytes (the bytes asked for, live) and its
reserved bytes, peak per phase span. Predicted: the recorded step's live
bytes per phase span, and its reserved bytes from memfit's allocator replay
of those events; the cuBLAS workspace (cuda_workspace, allocated through
the caching allocator at the first matmul) is added from the first forward
on, as memfit's CUDA estimate counts it: cuBLASLt's block replayed in the
small pool, the rest beside it (Note [cuBLASLt's block in the replay],
allocator_model.cpp).

Where the prediction recorded convolutions, their cuDNN workspaces are not
in it: its report's notes say how much they can add at the peak (Note
[cuDNN's workspace at the step's peak], card_kernels.cpp), and the
comparison shows the prediction as a range, the point up to the point plus
that bound, and whether the card's peak falls inside it. The errors stay
the point's.
"""

import array
from dataclasses import dataclass, field
from typing import List, Optional

from .._native import native as _memfit

__all__ = ["Comparison", "PhaseComparison"]


@dataclass
class PhaseComparison:
    phase: str
    iteration: int
    measured_allocated: int
    measured_reserved: int
    predicted_allocated: Optional[int]  # None: the prediction has no such phase
    predicted_reserved: Optional[int]

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _err(predicted, measured):
    return None if predicted is None or not measured else (predicted - measured) / measured


@dataclass
class Comparison:
    measured_peak_allocated: int
    measured_peak_reserved: int
    predicted_peak_allocated: int
    predicted_peak_reserved: int
    workspace_bytes: int  # the fixed workspace counted in the predicted allocated bytes
    phases: List[PhaseComparison] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    # What cuDNN's convolution workspaces can add to the allocated peak (the
    # prediction's note); None: no convolution recorded, the point alone.
    cudnn_workspace_bytes: Optional[int] = None
    # The same on the reserved peak: the segment one such request can take.
    cudnn_reserved_bytes: Optional[int] = None

    @property
    def predicted_peak_allocated_upper(self) -> int:
        """The top of the allocated range: the point plus cuDNN's bound."""
        return self.predicted_peak_allocated + (self.cudnn_workspace_bytes or 0)

    @property
    def predicted_peak_reserved_upper(self) -> int:
        return self.predicted_peak_reserved + (self.cudnn_reserved_bytes or 0)

    @property
    def allocated_upper_error(self) -> Optional[float]:
        """(top of the range - measured) / measured peak allocated bytes; the
        point's error where no convolution was recorded."""
        return _err(self.predicted_peak_allocated_upper, self.measured_peak_allocated)

    @property
    def reserved_upper_error(self) -> Optional[float]:
        return _err(self.predicted_peak_reserved_upper, self.measured_peak_reserved)

    @property
    def allocated_in_range(self) -> bool:
        """Whether the card's allocated peak lies in [point, point + bound]."""
        return (self.predicted_peak_allocated <= self.measured_peak_allocated
                <= self.predicted_peak_allocated_upper)

    @property
    def reserved_in_range(self) -> bool:
        return (self.predicted_peak_reserved <= self.measured_peak_reserved
                <= self.predicted_peak_reserved_upper)

    @property
    def reserved_error(self) -> Optional[float]:
        """(predicted - measured) / measured peak reserved bytes."""
        return _err(self.predicted_peak_reserved, self.measured_peak_reserved)

    @property
    def allocated_error(self) -> Optional[float]:
        return _err(self.predicted_peak_allocated, self.measured_peak_allocated)

    def table(self) -> str:
        fb = _memfit.format_bytes

        def pct(e):
            return "" if e is None else f"{e * 100:+.1f}%"

        rows = [("phase", "iter", "allocated", "predicted", "err", "reserved", "predicted",
                 "err")]
        for p in self.phases:
            rows.append((p.phase, str(p.iteration), fb(p.measured_allocated),
                         "-" if p.predicted_allocated is None else fb(p.predicted_allocated),
                         pct(_err(p.predicted_allocated, p.measured_allocated)),
                         fb(p.measured_reserved),
                         "-" if p.predicted_reserved is None else fb(p.predicted_reserved),
                         pct(_err(p.predicted_reserved, p.measured_reserved))))
        rows.append(("peak", "", fb(self.measured_peak_allocated),
                     fb(self.predicted_peak_allocated), pct(self.allocated_error),
                     fb(self.measured_peak_reserved), fb(self.predicted_peak_reserved),
                     pct(self.reserved_error)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["measured on the card (the snapshot) beside memfit's prediction "
                 "(recorded on the CPU):"]
        for k, r in enumerate(rows):
            lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(r, widths))).rstrip())
            if k == 0 or k == len(rows) - 2:
                lines.append("-" * len(lines[-1]))
        if self.cudnn_workspace_bytes is not None:
            lines.append(self._range_line("allocated", self.measured_peak_allocated,
                                          self.predicted_peak_allocated,
                                          self.predicted_peak_allocated_upper,
                                          self.allocated_upper_error))
            lines.append(self._range_line("reserved", self.measured_peak_reserved,
                                          self.predicted_peak_reserved,
                                          self.predicted_peak_reserved_upper,
                                          self.reserved_upper_error))
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    @staticmethod
    def _range_line(what, measured, point, upper, upper_error):
        fb = _memfit.format_bytes
        if measured < point:
            where = "below it: the prediction is over"
        elif measured <= upper:
            where = "inside it"
        else:
            where = "above it: the prediction is under"
        up = "" if upper_error is None else f" ({upper_error * 100:+.1f}%)"
        return (f"peak {what} with cuDNN's workspaces: {fb(point)} up to {fb(upper)}{up}; "
                f"the card's {fb(measured)} is {where}")

    def as_dict(self) -> dict:
        return {
            "measured_peak_allocated_bytes": self.measured_peak_allocated,
            "measured_peak_reserved_bytes": self.measured_peak_reserved,
            "predicted_peak_allocated_bytes": self.predicted_peak_allocated,
            "predicted_peak_reserved_bytes": self.predicted_peak_reserved,
            "allocated_error": self.allocated_error, "reserved_error": self.reserved_error,
            "workspace_bytes": self.workspace_bytes,
            "cudnn_workspace_bytes": self.cudnn_workspace_bytes,
            "predicted_peak_allocated_upper_bytes": self.predicted_peak_allocated_upper,
            "predicted_peak_reserved_upper_bytes": self.predicted_peak_reserved_upper,
            "allocated_upper_error": self.allocated_upper_error,
            "reserved_upper_error": self.reserved_upper_error,
            "allocated_in_range": self.allocated_in_range,
            "reserved_in_range": self.reserved_in_range,
            "phases": [p.as_dict() for p in self.phases], "notes": list(self.notes),
        }


def compare_prediction(measured_timeline, measured_reserved_after, measured_peak_allocated: int,
                       measured_peak_reserved: int, prediction_report,
                       prediction_timeline) -> Comparison:
    """The comparison table (See the module's docstring). The prediction is a
    report with a CUDA estimate (memfit.profile(..., target_device="cuda") or
    a built-in model's) and the timeline it was made from."""
    cuda = prediction_report.cuda
    if cuda is None:
        raise ValueError("[compare] the prediction has no CUDA estimate: profile it with "
                         "target_device='cuda' (memfit profile --target cuda)")
    workspace = int(cuda.workspace_bytes)
    allocated_workspace = int(_memfit.cuda_workspace_allocated(workspace))
    held = int(_memfit.cuda_workspace_held(workspace))
    pred_spans = _spans_of(prediction_timeline)
    # The prediction's reserved bytes after each of its events, replayed as
    # memfit's estimate is (See Note [cuBLASLt's block in the replay]).
    pred_reserved = array.array("q")
    pred_reserved.frombytes(_memfit.cuda_reserved_after(prediction_timeline, workspace))
    pred = {}
    forward_seen = False
    for name, it, first, end, peak in pred_spans:
        forward_seen |= name == "forward"
        res = max(pred_reserved[first:end], default=pred_reserved[first - 1] if first else 0)
        pred[(name, it)] = ((peak + allocated_workspace, res + held) if forward_seen else
                            (peak, res))
    rows = []
    meas_spans = _spans_of(measured_timeline)
    for name, it, first, end, peak in meas_spans:
        res = max(measured_reserved_after[first:end],
                  default=measured_reserved_after[first - 1] if first else 0)
        p = pred.get((name, it))
        if p is None:  # the prediction ran fewer iterations: its last of this phase
            its = [k[1] for k in pred if k[0] == name]
            p = pred.get((name, max(its))) if its else None
        rows.append(PhaseComparison(name, it, peak, res, None if p is None else p[0],
                                    None if p is None else p[1]))
    notes = ["allocated: the bytes asked for (the snapshot's sizes), not rounded to blocks"]
    # See Note [cuDNN's workspace at the step's peak] (card_kernels.cpp).
    cudnn = int(_memfit.cudnn_workspace_in_notes(list(prediction_report.notes)))
    cudnn_reserved = None
    if cudnn >= 0:
        cudnn_reserved = int(_memfit.cuda_segment_size(cudnn)) if cudnn else 0
        notes.append("the range: cuDNN's convolution workspaces, which the point leaves out, "
                     "can add up to the top on a free card (capped, cuDNN takes less); the "
                     "reserved top adds the segment one such request can take")
    other = _another_model(measured_timeline, prediction_timeline)
    if other:
        notes.insert(0, other)
    return Comparison(
        measured_peak_allocated=measured_peak_allocated,
        measured_peak_reserved=measured_peak_reserved,
        predicted_peak_allocated=int(prediction_report.peak_bytes) + allocated_workspace,
        predicted_peak_reserved=int(cuda.peak_reserved),
        workspace_bytes=allocated_workspace, phases=rows, notes=notes,
        cudnn_workspace_bytes=cudnn if cudnn >= 0 else None, cudnn_reserved_bytes=cudnn_reserved)


def _parameter_bytes(timeline):
    return int(timeline.breakdown_at_peak()["categories"]["parameter"])


def _another_model(measured_timeline, prediction_timeline):
    """A warning when the snapshot's parameters are not the prediction's (by
    more than 1%): the prediction is then of another model. "" when they
    agree, or when the trace shows none (recorded after they were made)."""
    measured = _parameter_bytes(measured_timeline)
    predicted = _parameter_bytes(prediction_timeline)
    if not measured or not predicted or abs(measured - predicted) <= 0.01 * measured:
        return ""
    fb = _memfit.format_bytes
    return (f"warning: the snapshot's parameters ({fb(measured)}) are not the predicted "
            f"model's ({fb(predicted)}): this predicts another model; predict the model the "
            f"snapshot ran")


def _spans_of(timeline):
    """(phase, iteration, first event, end event, peak live bytes) per phase
    span."""
    return [(name, it, first, end, s.peak) for (name, it, first, end), s in
            zip(timeline.phase_spans(), timeline.phase_summaries())]
