"""torch.compile as advise's rows: the compiled step itself, and
torch._functorch.config.activation_memory_budget planned in bytes.

Note [The memory budget planned in bytes]
activation_memory_budget (0..1) tells AOTAutograd's min-cut partitioner
what share of the activations it may save for backward; the rest is
recomputed. It is a fraction, not bytes, and the step's real peak is not
monotone in it (pytorch/pytorch#197838: 0.05 gave 3.6-4.2x the peak of
0.15; on memfit's 4-layer MLP, 0.5 lowered the peak by 19% and 0.2 and 0
gave it back, the recomputation in backward making a peak of its own). So
memfit does not bisect it: each fraction of FRACTIONS, largest first, is
compiled and its warm step recorded (memfit.profile), and the plan is the
first whose measured peak fits the budget: the largest fraction measured
to fit, verified by that real compiled step. Each is compiled through a
function of memfit's own (compiled.fresh_call) by a backend that sets the
fraction while inductor partitions, so the user's compiled model keeps its
cache and its recompile limit, and no global setting changes.
Below 1 the recomputed random ops (dropout) draw other numbers than the
forward did, and the gradients are wrong (pytorch/pytorch#190758, open): a
model with dropout gets the fraction as an approximate row, planned only
with allow_approximate.
"""

from __future__ import annotations

import dataclasses

import torch

from ..._native import format_bytes
from ..._step.compiled import fresh_call, is_compiled, uncompiled_call
from ...report.profile import profile

__all__: list = []

# The fractions measured, largest first (See Note [The memory budget planned
# in bytes]); 1.0 is the plain compiled step.
FRACTIONS = (0.8, 0.6, 0.4, 0.2, 0.0)


class BudgetBackend:
    """inductor, with activation_memory_budget=`fraction` (None: torch's
    own) while it partitions the joint graph."""

    def __init__(self, fraction: float | None) -> None:
        self.fraction = fraction

    def __call__(self, gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        if self.fraction is None:
            return compile_fx(gm, example_inputs)
        with torch._functorch.config.patch(activation_memory_budget=self.fraction):
            return compile_fx(gm, example_inputs)


class _CompiledWith(torch.nn.Module):
    """`module` called through memfit's own compile of it (the parameters
    are the module's own, under "module.")."""

    def __init__(self, module, backend):
        super().__init__()
        self.module = module
        self.forward = torch.compile(fresh_call(uncompiled_call(module)), backend=backend)


@dataclasses.dataclass
class CompileRow:
    """One compiled (or eager) step measured at the user's whole batch."""

    name: str
    kind: str  # eager | compile | memory_budget
    fraction: float | None  # activation_memory_budget; None: torch's own
    peak_bytes: int
    saving_bytes: int  # advise's plain step's peak - peak
    fits: bool | None  # None without a budget
    exact: bool
    compile_seconds: float
    note: str = ""


@dataclasses.dataclass
class CompilePlan:
    """The largest fraction measured to fit (found=False: none did)."""

    found: bool
    fraction: float | None
    peak_bytes: int
    exact: bool
    summary: str


def dropout_of(model) -> str | None:
    """"dropout p=0.1 at blocks.0.drop" for the first dropout that draws,
    or None."""
    for path, m in model.named_modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            return f"dropout p={m.p} at {path or 'the model'}"
    return None


def _measure(module, bench, progress):
    report = profile(module, bench.inputs, bench.target, loss_fn=bench.loss_fn,
                     optimizer=bench.optimizer, batch_dim=bench.batch_dim,
                     target_device=bench.target_device, progress=progress,
                     **bench.loop.profile_args())
    return report


def compile_rows(model, bench, plain_peak: int, limit: int | None, allow_approximate: bool,
                 fractions=FRACTIONS, progress=None):
    """(rows, plan, notes): torch.compile itself as a row (for a compiled
    model, its eager step; else the step compiled by inductor), and where
    the compiled step does not fit `limit`, the activation_memory_budget
    fractions measured largest first until one fits (See Note [The memory
    budget planned in bytes]). `bench`: advise's Bench (inputs, optimizer,
    ...); plain_peak: advise's plain step's peak."""
    rows, notes = [], []

    def fits(peak):
        return None if limit is None else peak <= limit

    if is_compiled(model):
        report = profile(model, bench.inputs, bench.target, loss_fn=bench.loss_fn,
                         optimizer=bench.optimizer, batch_dim=bench.batch_dim,
                         target_device=bench.target_device, progress=progress,
                         compare_eager=True, **bench.loop.profile_args())
        eager = report.eager_peak_bytes
        rows.append(CompileRow("without torch.compile (eager)", "eager", None, eager,
                               plain_peak - eager, fits(eager), True, 0.0,
                               "the plain step is compiled"))
        compiled_peak = report.budget_peak_bytes
    else:
        report = _measure(_CompiledWith(model, BudgetBackend(None)), bench, progress)
        compiled_peak = report.budget_peak_bytes
        rows.append(CompileRow("torch.compile (inductor)", "compile", None, compiled_peak,
                               plain_peak - compiled_peak, fits(compiled_peak), True,
                               report.compile.seconds if report.compile else 0.0))
    plan = CompilePlan(False, None, compiled_peak, True, "")
    if limit is not None and compiled_peak <= limit and rows[-1].kind == "compile":
        plan = CompilePlan(True, None, compiled_peak, True, "torch.compile (inductor)")
    if limit is None or compiled_peak <= limit:
        return rows, plan, notes
    drop = dropout_of(model)
    exact = drop is None
    note = "" if exact else (
        f"below 1 the recomputed random ops give wrong gradients (pytorch/pytorch#190758): "
        f"{drop}")
    for f in fractions:
        report = _measure(_CompiledWith(model, BudgetBackend(f)), bench, progress)
        peak = report.budget_peak_bytes
        row = CompileRow(f"torch.compile, activation_memory_budget={f}", "memory_budget", f,
                         peak, plain_peak - peak, peak <= limit, exact,
                         report.compile.seconds if report.compile else 0.0, note)
        rows.append(row)
        if row.fits:
            if exact or allow_approximate:
                plan = CompilePlan(True, f, peak, exact,
                                   f"torch.compile with activation_memory_budget={f}: "
                                   f"{format_bytes(peak)} measured (a warm compiled step)")
            break
    if not plan.found:
        best = min((r for r in rows if r.kind == "memory_budget"), key=lambda r: r.peak_bytes)
        why = "none fits" if not best.fits else "dropout: approximate, allow_approximate=False"
        notes.append(f"activation_memory_budget: {why}; the lowest measured was "
                     f"{format_bytes(best.peak_bytes)} at {best.fraction}")
    return rows, plan, notes


class CompiledApplied:
    """A compile plan on a model until restore() (or the end of a `with`
    block): its compiled call replaced by inductor's with the plan's
    activation_memory_budget (See Note [The memory budget planned in
    bytes]); the model's own compiled call comes back after."""

    def __init__(self, model, fraction):
        self.model = model
        backend = BudgetBackend(fraction)
        if hasattr(model, "_orig_mod"):  # torch.compile(model): its forward is the compiled call
            self._attr, self._old = "forward", model.__dict__.get("forward")
            model.forward = torch.compile(fresh_call(model._orig_mod.__call__), backend=backend)
        else:  # in place, or an eager model compiled now
            self._attr, self._old = "_compiled_call_impl", model._compiled_call_impl
            model._compiled_call_impl = torch.compile(fresh_call(model._call_impl),
                                                      backend=backend)

    def restore(self):
        if self.model is not None:
            setattr(self.model, self._attr, self._old)
            self.model = None

    def __enter__(self):
        return self.model

    def __exit__(self, *exc):
        self.restore()
