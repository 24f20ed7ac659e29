"""What memfit.advise returns: the recorded rows, the plan, and the Advice
that prints them (the core's table and JSON, as `memfit advise` prints)
and applies the plan to a model."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch

from . import Strategy, applied
from .compiler import CompiledApplied, CompilePlan, CompileRow

__all__ = ["Row", "Plan", "CardPlan", "Advice"]


@dataclasses.dataclass
class Row:
    """One strategy measured at the user's whole batch."""

    name: str
    # baseline | memory | checkpointing | precision | optimizer | eval | combination | setting
    kind: str
    strategy: Strategy
    peak_bytes: int  # memfit.profile of the transformed step
    saving_bytes: int  # plain peak (recorded the same way) - peak; negative: costs memory
    time_ratio: float  # step time / the plain step's; None: unknown
    fits: bool  # peak <= budget; None without a budget
    exact: bool  # same result as the plain step
    recompute_ns: float = None  # checkpointing: forward time recomputed
    predicted_peak_bytes: int = None  # checkpointing: the planner's prediction
    meta: bool = False  # recorded on the meta device
    time_measured: bool = False  # False: time_ratio estimated from the recorded times
    predicted: bool = False  # peak predicted from other rows, not recorded ("~" in the table)
    # the KV cache the step keeps (an HF model with use_cache=True), in the
    # peak; 0: none; None: not known (a setting whose copy was not made)
    kv_cache_bytes: int = 0

    def to_dict(self):
        d = dataclasses.asdict(self)
        d["strategy"] = dataclasses.asdict(self.strategy)
        d["strategy"]["checkpoint"] = list(self.strategy.checkpoint)
        return d


@dataclasses.dataclass
class Plan:
    """What to run: found=False when there is no budget to plan for."""

    found: bool
    strategy: Strategy
    summary: str
    peak_bytes: int
    time_ratio: float  # None: unknown
    exact: bool
    # the optimizer to train with (adam, momentum, sgd, ...); "-offload" after
    # it: that optimizer wrapped in memfit.offload
    optimizer: str
    micro_batch: int = 0  # memfit.Trainer(micro_batch=...); 0: the whole batch
    time_measured: bool = False
    kv_cache_bytes: int = 0  # the KV cache a micro-batch's step keeps (See Row)


@dataclasses.dataclass
class CardPlan:
    """The plan for one card of memfit.advise(..., cards=[...])."""

    budget_bytes: int
    plan: Plan  # plan.found False: nothing measured fits; peak_bytes the closest


def _has_block(model, paths, i):
    try:
        model.get_submodule(paths[i])
        return True
    except (AttributeError, IndexError):
        return False


def _holding_blocks(model, paths, indices):
    """`model` when it has every block the strategy checkpoints; else the
    model a PEFT wrapper holds (get_base_model(): the advice was made on it,
    before a setting's LoRA wrapped it) when that one has them; else None."""
    if all(_has_block(model, paths, i) for i in indices):
        return model
    base = getattr(model, "get_base_model", None)
    if callable(base) and all(_has_block(base(), paths, i) for i in indices):
        return base()
    return None


class _Applied:
    """A strategy's model-side parts, on the model until restore() (or the
    end of a `with` block)."""

    def __init__(self, model, strategy, block_paths):
        self._cm = applied(model, strategy, block_paths)
        self._cm.__enter__()
        self.model = model

    def restore(self):
        if self._cm is not None:
            cm, self._cm = self._cm, None
            cm.__exit__(None, None, None)

    def __enter__(self):
        return self.model

    def __exit__(self, *exc):
        self.restore()


class Advice:
    """Every strategy measured on the model, and the plan for the budget.

    model (class name), batch, budget_bytes (None: no budget), optimizer
    (the user's: adam, momentum, sgd, none or a class name),
    parameter_bytes, plain_peak_bytes, plain_step_ms; cuda_reserved
    (True: every peak is the CUDA caching allocator's reserved bytes, for
    target_device="cuda"; False: allocated bytes); chain (a Chain:
    path, block_paths, found; None without one); rows (Row: name, kind,
    strategy, peak_bytes, saving_bytes, time_ratio, fits, exact,
    recompute_ns, predicted_peak_bytes); segments and chain_memory (what
    the core planner was given); chain_plans (its rules compared:
    rule, checkpointed, predicted_peak, recompute_ns, fits); plan (Plan:
    found, strategy, summary, peak_bytes, time_ratio, exact, optimizer,
    micro_batch, time_measured); settings (the Settings proposed, as
    memfit.strategies.llm_settings.Setting); cards (CardPlan: budget_bytes,
    plan; [] unless advise was given cards); notes.
    """

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def apply(self, model: torch.nn.Module, what: str | None = None) -> Any:
        """Put the plan's (or a Row's / Strategy's) model-side parts on
        `model` (this model or a copy of it): checkpointed blocks, bf16
        autocast. Returns a handle: use it in a `with` block, or call
        restore(). The optimizer is the training loop's (optimizer_for()
        gives the one the plan trains with); memfit.Trainer frees gradients
        itself. A compile plan or row (advice.compile_plan, the default when
        the core's plan found nothing) compiles the model's call with its
        activation_memory_budget instead (strategies/compiler.py)."""
        cplan = getattr(self, "compile_plan", None)
        if what is None and not self.plan.found and cplan is not None and cplan.found:
            what = cplan
        if isinstance(what, (CompilePlan, CompileRow)):
            if isinstance(what, CompilePlan) and not what.found:
                raise ValueError("[Advice.apply] the compile plan found no fraction that fits")
            return CompiledApplied(model, what.fraction)
        s = what.strategy if isinstance(what, Row) else what or self.plan.strategy
        if s.setting is not None:
            raise ValueError(
                f"[Advice.apply] the strategy uses the setting {s.setting!r}, which changes the "
                f"model itself: apply advice.setting({s.setting!r}).apply to your model (or a "
                f"copy), then checkpoint and micro-batch as the plan says")
        paths = self.chain.block_paths if self.chain else []
        holder = _holding_blocks(model, paths, s.checkpoint)
        if holder is None:
            missing = next(i for i in s.checkpoint if not _has_block(model, paths, i))
            raise ValueError(
                f"[Advice.apply] the model has no block "
                f"{paths[missing] if missing < len(paths) else missing!r} to checkpoint: apply "
                f"the advice to the model it was made for")
        applied_to = _Applied(holder, s, paths)
        applied_to.model = model  # what the `with` block gives: the model passed
        return applied_to

    def setting(self, label: str) -> Any:
        """The proposed Setting named `label` (a row's name, plan.strategy.setting)."""
        for st in getattr(self, "settings", []):
            if st.label == label:
                return st
        raise ValueError(f"[Advice.setting] no setting {label!r} was proposed: one of "
                         f"{[st.label for st in getattr(self, 'settings', [])]}")

    def optimizer_for(self, optimizer: torch.optim.Optimizer,
                      what: str | None = None) -> torch.optim.Optimizer:
        """The optimizer to train with under the plan (or a Row's / Strategy's
        strategy): `optimizer` itself, or wrapped in memfit.offload where the
        plan keeps its state on the host. A plan that changes the optimizer
        (a lighter one, allow_approximate) names it instead: build that one
        with your hyperparameters."""
        s = what.strategy if isinstance(what, Row) else what or self.plan.strategy
        if s.optimizer is not None:
            raise ValueError(
                f"[Advice.optimizer_for] the plan trains with {s.optimizer} instead of "
                f"{self.optimizer}: build that optimizer with your hyperparameters")
        if not s.host_state:
            return optimizer
        from ...memory.offload import OffloadedOptimizer, offload
        return optimizer if isinstance(optimizer, OffloadedOptimizer) else offload(optimizer)

    def table(self) -> str:
        """The table `memfit advise` prints: the rows, the checkpointing
        rules, the plan and the notes (and the cards' plans, if asked); then
        torch.compile's rows."""
        text = self.native.table()
        rows = getattr(self, "compile_rows", None)
        if not rows:
            return text
        return text + "\n\n" + _compile_table(rows, self.compile_plan)

    def cards_table(self) -> str:
        """What fits on which card: each card's plan, peak, time and result
        ("" when advise was not given cards)."""
        return self.native.cards_table()

    def to_json(self, pretty: bool = True) -> str:
        """Keys: model, batch, budget_bytes, optimizer, parameter_bytes,
        plain_peak_bytes, plain_step_ms, chain, strategies, checkpoint_rules,
        plan, notes (as `memfit advise --json`), each strategy's, the plan's
        and each card's kv_cache_bytes; "compiler": torch.compile's rows and
        plan, where measured."""
        d = json.loads(self.native.to_json(pretty))
        # Each row's, the plan's and each card's KV cache (See Row.kv_cache_bytes).
        for row, entry in zip(getattr(self, "rows", []), d.get("strategies", [])):
            entry["kv_cache_bytes"] = row.kv_cache_bytes
        if "plan" in d and hasattr(self, "plan"):
            d["plan"]["kv_cache_bytes"] = self.plan.kv_cache_bytes
        for card, entry in zip(getattr(self, "cards", []), d.get("cards", [])):
            entry["kv_cache_bytes"] = card.plan.kv_cache_bytes
        rows = getattr(self, "compile_rows", None)
        if rows:
            d["compiler"] = {"rows": [dataclasses.asdict(r) for r in rows],
                             "plan": dataclasses.asdict(self.compile_plan)}
        return json.dumps(d, indent=2 if pretty else None)

    def __repr__(self):
        return self.table()


def _compile_table(rows, plan):
    """torch.compile's rows as text, under advise's table."""
    from ..._native import format_bytes
    lines = [f"{'torch.compile':<44}  {'peak':>10}  {'saving':>11}  {'fits':>4}  compile",
             f"{'-' * 44}  {'-' * 10}  {'-' * 11}  {'-' * 4}  -------"]
    for r in rows:
        sign = "+" if r.saving_bytes >= 0 else "-"
        fits = "-" if r.fits is None else ("yes" if r.fits else "no")
        lines.append(f"{r.name:<44}  {format_bytes(r.peak_bytes):>10}  "
                     f"{sign + format_bytes(abs(r.saving_bytes)):>11}  {fits:>4}  "
                     f"{r.compile_seconds:.1f} s" + (f"  ({r.note})" if r.note else ""))
    if plan is not None and plan.found:
        lines.append(f"compile plan: {plan.summary}; advice.apply(model, advice.compile_plan)")
    return "\n".join(lines)
