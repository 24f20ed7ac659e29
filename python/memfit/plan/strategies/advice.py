"""What memfit.advise returns: the recorded rows, the plan, and the Advice
that prints them (the core's table and JSON, as `memfit advise` prints)
and applies the plan to a model."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch

from ..._native import format_bytes
from ..._step.device import to_bytes
from ...memory.offload import OffloadedOptimizer, offload
from . import Strategy, applied
from .compiler import CompiledApplied, CompilePlan, CompileRow
from .llm_settings import user_optimizer_on
from .optimizer import make_optimizer

__all__ = ["Row", "Plan", "CardPlan", "AppliedPlan", "Advice"]


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


class AppliedPlan:
    """A plan put on a model by Advice.apply_plan: what to train and how.

    model: the model to train (the one passed, or the wrapper the plan's
    setting made of it: peft's for LoRA and QLoRA); optimizer: the
    optimizer to train it with (None when the advice had none);
    micro_batch: the plan's (0: the whole batch), for memfit.Trainer;
    set_to_none: what your own loop's zero_grad should pass (memfit.Trainer
    frees gradients itself); plan: the Plan applied. The setting changed
    the model for good; restore() (or the end of a `with` block) takes off
    the checkpointing and autocast only. Train with

        memfit.Trainer(a.model, a.optimizer, micro_batch=a.micro_batch, plan=False)

    at the batch advise was given. Under the chunked loss the Trainer cannot
    tell how the model's loss reduces the batch: pass it reduction="mean"
    (exact when each micro-batch holds as many labelled tokens).
    """

    def __init__(self, model, optimizer, plan, handle):
        self.model = model
        self.optimizer = optimizer
        self.plan = plan
        self.micro_batch = plan.micro_batch
        self.set_to_none = not plan.strategy.zero_grad_in_place
        self._handle = handle

    def restore(self) -> None:
        self._handle.restore()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()


def _is_peft(model):
    return hasattr(model, "peft_config") and callable(getattr(model, "get_base_model", None))


def _class_of(model):
    """The class name advise records for `model` (a PEFT wrapper: the model it wraps)."""
    return type(model.get_base_model() if _is_peft(model) else model).__name__


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
        """Put the plan's (or a Row's, a row's named by its name, a
        Strategy's) model-side parts on `model` (this model or a copy of
        it): checkpointed blocks, bf16 autocast. A plan with a setting:
        apply_plan. Returns a handle: use it in a `with` block, or call
        restore(). The optimizer is the training loop's (optimizer_for()
        gives the one the plan trains with); memfit.Trainer frees gradients
        itself. A compile plan or row (advice.compile_plan, the default when
        the core's plan found nothing) compiles the model's call with its
        activation_memory_budget instead (strategies/compiler.py)."""
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"[Advice.apply] model must be the torch.nn.Module advise was "
                            f"given, got {type(model).__name__}")
        cplan = getattr(self, "compile_plan", None)
        if what is None and not self.plan.found and cplan is not None and cplan.found:
            what = cplan
        if isinstance(what, (CompilePlan, CompileRow)):
            if isinstance(what, CompilePlan) and not what.found:
                raise ValueError("[Advice.apply] the compile plan found no fraction that fits")
            return CompiledApplied(model, what.fraction)
        s = self._strategy_of(what, "Advice.apply")
        if s.setting is not None:
            raise ValueError(
                f"[Advice.apply] the strategy uses the setting {s.setting!r}, which changes the "
                f"model itself: call advice.apply_plan(model, optimizer), which applies the "
                f"setting, the checkpointing and the optimizer together")
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

    def apply_plan(self, model: torch.nn.Module, optimizer: Any = None,
                   card: Any = None) -> AppliedPlan:
        """Put the whole plan on `model`, the model advise was given (or
        one like it): the plan's setting (LoRA, QLoRA, bf16 weights, 8-bit
        AdamW, the chunked loss ...; applied to `model` itself: pass a copy
        to keep yours), its checkpointing (on the blocks under a PEFT
        wrapper too), autocast, and the optimizer it trains with (yours,
        rebuilt over the setting's trainable parameters; offloaded where
        the plan keeps the state on the host). card: a budget of
        advise(cards=[...]) ("12GiB" or bytes): that card's plan; None: the
        plan for advise's budget. Returns an AppliedPlan (model, optimizer,
        micro_batch); train it with
        memfit.Trainer(a.model, a.optimizer, micro_batch=a.micro_batch, plan=False)
        at the batch advise was given."""
        what = "Advice.apply_plan"
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"[{what}] model must be the torch.nn.Module advise was given, got "
                            f"{type(model).__name__}")
        plan = self._plan_of(card, what)
        s = plan.strategy
        inner = getattr(model, "_orig_mod", None)  # torch.compile's wrapper
        if s.setting is not None and isinstance(inner, torch.nn.Module):
            raise ValueError(
                f"[{what}] {type(inner).__name__} is compiled (torch.compile) and the plan's "
                f"setting {s.setting!r} changes the model: pass the model before compiling "
                f"it (model._orig_mod), then compile applied.model")
        made_for = getattr(self, "model", None)
        if made_for and _class_of(model) != made_for:
            raise ValueError(f"[{what}] the advice was made for a {made_for}, got a "
                             f"{_class_of(model)}: apply it to the model it was made for")
        setting = None if s.setting is None else self.setting(s.setting)
        if setting is not None and _is_peft(model):
            raise ValueError(
                f"[{what}] the model is already a PEFT model ({type(model).__name__}) and the "
                f"plan's setting {s.setting!r} makes one itself: pass the model advise was "
                f"given, not advice.setting(...).apply's")
        trained = model if setting is None else setting.apply(model)
        handle = self.apply(trained, dataclasses.replace(s, setting=None))
        return AppliedPlan(trained, self._optimizer_of(trained, optimizer, s, setting, what),
                           plan, handle)

    def _plan_of(self, card, what):
        """The plan for `card` (None: advise's budget), found, or one line why not."""
        cards = getattr(self, "cards", [])
        if card is None:
            plan = self.plan
            if not plan.found and cards:
                raise ValueError(f"[{what}] advise was given cards and no budget: pass card= "
                                 f"one of {[format_bytes(c.budget_bytes) for c in cards]}")
            if not plan.found:
                raise ValueError(f"[{what}] the advice has no plan: advise was given no budget; "
                                 f"pass budget= (or cards=[...]) to advise")
            return plan
        want = to_bytes(card, what)
        match = [c for c in cards if c.budget_bytes == want]
        if not match:
            raise ValueError(
                f"[{what}] no card of {format_bytes(want)} was planned: advise's cards are "
                f"{[format_bytes(c.budget_bytes) for c in cards]}; pass one of them, or advise "
                f"again with cards=[{card!r}]")
        plan = match[0].plan
        if not plan.found:
            raise ValueError(
                f"[{what}] nothing measured fits the card of {format_bytes(want)}: the least "
                f"measured, {plan.summary}, peaks at {format_bytes(plan.peak_bytes)}; pick a "
                f"bigger card")
        return plan

    def _optimizer_of(self, model, optimizer, s, setting, what):
        """The optimizer the plan trains `model` with, from the user's."""
        if setting is not None and setting.optimizer is not None:
            opt = setting.optimizer(model, optimizer)
        elif s.optimizer is not None:
            opt = make_optimizer(model, s.optimizer)  # a lighter one, as advise recorded it
        elif optimizer is None or isinstance(optimizer, str):
            name = optimizer or getattr(self, "optimizer", None)
            if name in (None, "none"):
                return None
            try:
                opt = make_optimizer(model, name)
            except KeyError:
                raise ValueError(
                    f"[{what}] the plan trains with your {name}: pass it as optimizer= (it is "
                    f"rebuilt over the parameters the plan trains)") from None
        elif not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"[{what}] optimizer must be a torch.optim.Optimizer, a name or "
                            f"None, got {type(optimizer).__name__}")
        else:
            opt = optimizer if setting is None else user_optimizer_on(model, optimizer)
        if s.host_state:
            opt = opt if isinstance(opt, OffloadedOptimizer) else offload(opt)
        return opt

    def _strategy_of(self, what, op):
        """The Strategy `what` names: None (the plan's), a Row, a row's
        name or a Strategy; anything else refused in one line."""
        if what is None:
            if not self.plan.found:
                cards = ("; for a card's plan, advice.apply_plan(model, card=...)"
                         if getattr(self, "cards", None) else "")
                raise ValueError(
                    f"[{op}] the advice has no plan: advise was given no budget; pass a row "
                    f"(advice.rows[i]), or advise again with budget={cards}")
            return self.plan.strategy
        if isinstance(what, str):
            rows = [r for r in getattr(self, "rows", []) if r.name == what]
            if not rows:
                raise ValueError(f"[{op}] no row is named {what!r}: one of "
                                 f"{[r.name for r in getattr(self, 'rows', [])]}")
            return rows[0].strategy
        if isinstance(what, (Row, Plan)):
            return what.strategy
        if isinstance(what, Strategy):
            return what
        raise TypeError(f"[{op}] what must be a Row, a row's name, a Plan or a Strategy "
                        f"(None: the plan), got {type(what).__name__}")

    def setting(self, label: str) -> Any:
        """The proposed Setting named `label` (a row's name, plan.strategy.setting;
        a Row or a Plan names its own)."""
        if isinstance(label, (Row, Plan)) and label.strategy.setting is not None:
            label = label.strategy.setting
        if not isinstance(label, str):
            raise TypeError(f"[Advice.setting] label must be a setting's name (a str, e.g. "
                            f"plan.strategy.setting), got {type(label).__name__}")
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
        s = self._strategy_of(what, "Advice.optimizer_for")
        if s.optimizer is not None:
            raise ValueError(
                f"[Advice.optimizer_for] the plan trains with {s.optimizer} instead of "
                f"{self.optimizer}: build that optimizer with your hyperparameters")
        if not s.host_state:
            return optimizer
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
