"""memfit.doctor(): the context manager around the user's loop, which
observes, checks, tries the fixes and reports."""

from __future__ import annotations

import dataclasses

import torch

from .._step.arguments import flag
from .._step.batching import count
from .._step.tracking import Tracking
from . import trials
from .checks import run_checks
from .lifetimes import build_run
from .observe import Observer, StopRun
from .oom import is_oom, oom_finding
from .report import format_report

__all__ = ["Doctor", "doctor"]


class Doctor:
    """Finds the memory mistakes of the loop run inside it.

        with memfit.doctor(model, optimizer) as d:
            for x, y in loader: ...
        print(d.report()); d.findings

    A step is one optimizer.step(); where none runs (evaluation), one
    forward of the model, from its start to the next one's (the last one's
    to the block's end; not counted when an exception ended the block). `model=None`: the
    outermost call of any module with parameters is a forward (a loss
    module has none); `optimizer=None`: any optimizer's step is a step.
    `trials`: re-run the last forward with each fix that can be applied
    automatically (no_grad, set_to_none, .item()) and report the measured
    saving. `max_steps`: stop the loop (raise StopRun out of it, which the
    block swallows) once that many steps ran.

    Only memory memfit tracks is seen: the CPU (and meta) allocations of the
    process, as when rehearsing a GPU run on the CPU. A compiled model's
    calls are seen from outside its compiled code (nothing recompiles; pass
    the model for one compiled in place), and what compiles during the
    loop is checked: a recompile at every step, graph breaks (See Note
    [The doctor beside compiled code]).
    """

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, *, trials: bool = True,
                 max_steps: int | None = None) -> None:
        _check_arguments(model, optimizer, trials, max_steps)
        self.model = model
        self.optimizer = optimizer
        self.trials = trials
        self.max_steps = max_steps
        self.findings = []
        self.steps = ()  # lifetimes.Step of each complete step
        self.step_kind = "forward"
        self.outside_bytes = 0  # parameters, buffers, optimizer state from before
        self._observer = None
        self._tracking = None
        self._used = False
        self._split = None  # the graph-break trial, run once

    def __enter__(self):
        if self._used:
            raise RuntimeError("[doctor] a Doctor observes one block; make a new one")
        self._used = True
        self._tracking = Tracking()
        self._observer = Observer(self._tracking, self.model, self.optimizer, self.max_steps)
        try:
            self._observer.start()
        except BaseException:
            self._tracking.stop()
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        observer, tracking = self._observer, self._tracking
        try:
            observation = observer.stop()
        finally:
            tracking.stop()
        stopped = exc_type is not None and issubclass(exc_type, StopRun)
        failed = exc_type is not None and not stopped
        oom = []
        if is_oom(exc):
            # What the OOM left alive is still held by its traceback's frames.
            oom = [oom_finding(exc, observer.optimizer_steps, self.model,
                               observer.optimizers_seen())]
            self.findings = oom
        try:
            run = build_run(tracking.timeline.events(), observation, finished=exc_type is None)
            self.steps, self.step_kind = run.steps, run.step_kind
            self.outside_bytes = observation.outside_bytes
            findings = run_checks(run)
            if self.trials and not failed:
                findings = [self._try(f, observer, run) for f in findings]
            self.findings = oom + findings
        except Exception:
            if not failed:
                raise  # else the loop's own exception is the one to see
        finally:
            observer.inputs, observer.last_inputs = {}, None
            self._observer = self._tracking = None
        return stopped

    def _try(self, finding, observer, run):
        forwards = run.observation.forwards
        if finding.kind == "eval_with_grad":
            inputs = observer.inputs.get(finding.where, observer.last_inputs)
            result = trials.try_no_grad(inputs, _after_forward(run, finding.where))
        elif finding.kind == "grads_kept":
            site = next((f.site for f in forwards if f.grad_bytes_present), None)
            inputs = observer.inputs.get(site, observer.last_inputs)
            zgs = run.observation.zero_grads  # none at all: accumulated through backward
            zeroed = not zgs or any(not z.set_to_none for z in zgs)
            result = trials.try_set_to_none(inputs, list(observer.params()), zeroed)
        elif finding.kind == "graph_kept":
            backward = any(f.backward_reached for f in forwards)
            result = trials.try_item(observer.last_inputs, backward)
        elif finding.kind == "retain_graph":
            result = trials.try_without_retain(observer.last_inputs)
        elif finding.kind == "graph_break":
            if self._split is None:  # one re-run measures every break
                self._split = trials.try_graph_split(observer.last_inputs)
            handed = self._split.saving or {}
            key = (finding.where.file, finding.where.line)
            if key not in handed:
                return dataclasses.replace(finding, trial=self._split.how if self._split.saving
                                           is None else "not measured: the re-run did not "
                                           "break there")
            n = handed[key]
            return dataclasses.replace(finding, bytes=n, estimated_saving=n,
                                       trial=self._split.how)
        else:
            return finding
        return dataclasses.replace(finding, measured_saving=result.saving, trial=result.how)

    def __repr__(self):
        return (f"Doctor({len(self.findings)} findings, {len(self.steps)} steps, "
                f"peak_bytes={self.peak_bytes})")

    @property
    def peak_bytes(self) -> int:
        """The highest step peak (tracked bytes allocated inside the block)."""
        return max((s.peak for s in self.steps), default=0)

    def report(self) -> str:
        """The findings as text, largest saving first."""
        peak_step = max(self.steps, key=lambda s: s.peak).index if self.steps else 0
        return format_report(self.findings, len(self.steps), self.step_kind, self.peak_bytes,
                             peak_step, self.outside_bytes)


def _after_forward(run, site):
    """The most bytes the loop had on top of its least beside a forward
    with grad at `site`, while that forward's output lived (`.argmax()`,
    and the next forward where `pred = model(x)` keeps it): what the
    no_grad trial adds to the bytes the forward holds. None where what a
    forward held outlives the next step (`total += loss`, a list of
    outputs): it piles up, and what each forward holds is what no_grad
    saves."""
    forwards = [f for f in run.observation.forwards if f.site == site and f.grad_enabled
                and 0 <= run.step_of(f.first_event) < len(run.steps)]
    most = 0
    for f in forwards[-3:]:  # the steady ones: a run holds many
        k = run.step_of(f.first_event)
        mine = [a for a in run.allocations.values()
                if f.first_event <= a.alloc_event < f.end_event]
        if k + 1 < len(run.steps) and any(a.alive_at_boundary(run.steps[k + 1].end_event)
                                          for a in mine):
            return None  # alive a step later: held past the next forward
        frees = [run.allocations[i].free_event for i in f.output_ids if i in run.allocations]
        end = run.steps[k].end_event
        if frees:
            end = len(run.live) if None in frees else max(frees)
        end = min(end, len(run.live))
        beside = [run.live[e] - sum(a.bytes for a in mine if a.alive_after(e))
                  for e in range(max(f.first_event - 1, 0), end)]
        if beside and end > f.end_event:
            most = max(most, max(beside[f.end_event - end:]) - min(beside))
    return most


def _check_arguments(model, optimizer, trials, max_steps):
    """Raises ValueError, one line, for what the doctor cannot watch."""
    if model is not None and not isinstance(model, torch.nn.Module):
        raise ValueError(f"[doctor] model must be the torch.nn.Module the loop trains (or None: "
                         f"any model), got {type(model).__name__} {model!r:.40}")
    if optimizer is not None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"[doctor] optimizer must be the torch.optim optimizer the loop "
                             f"steps (or None: any optimizer), got {type(optimizer).__name__} "
                             f"{optimizer!r:.40}")
        if model is not None:
            trainable = [p for p in model.parameters() if p.requires_grad]
            held = {id(p) for g in optimizer.param_groups for p in g["params"]}
            if trainable and not any(id(p) in held for p in trainable):
                raise ValueError(
                    f"[doctor] the {type(optimizer).__name__} optimizer holds none of the "
                    f"model's {len(trainable)} trainable parameters: it steps another model "
                    f"(or a copy of this one), so its steps would not be this model's; pass "
                    f"the optimizer made over model.parameters()")
    flag(trials, "doctor", "trials")
    if max_steps is not None:
        count(max_steps, "doctor", "max_steps")


def doctor(model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
           *, trials: bool = True) -> Doctor:
    """The memory mistakes of the loop run inside the block, each with the
    user's line, the bytes it costs per step and the one-line fix.

        with memfit.doctor(model, optimizer) as d:
            for x, y in loader:
                ...
        print(d.report())
        for f in d.findings:  # kind, bytes, where, seen, fix, ...
            ...

    See Doctor for the arguments; `python -m memfit doctor script.py` runs
    a script under it unchanged."""
    return Doctor(model, optimizer, trials=trials)
