"""memfit.advise: when a step does not fit, each strategy that lowers its
memory recorded on the user's own model, and the cheapest plan that fits.
The planner is the core's, the same as `memfit advise` runs (See Note [How
advise plans], src/core/plan/advise_plan.cpp); this module records the user's
model when it asks (a setting on a copy of it), and times the plan."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Sequence

import torch

from .._native import native as _memfit
from .._step.batching import batch_size, count, tensors_in
from .._step.device import budget_target, to_bytes
from .._step.gc_frozen import with_gc_frozen
from .._step.hints import Batch, LossFn, OptimizerArg, ProgressArg, Size, StepFn
from .._step.loop import as_loop
from .._step.meta_checked import unchecked
from .._step.progress import as_progress
from .._step.step_flops import counting_flops
from .._step.training_step import check_optimizer
from .._step.user_state import kept_rng
from .._step.user_step import as_user_step
from .cost import StepFlops, count_step_flops
from .fit import DoesNotFit
from .strategies import Strategy, resolve_chain
from .._step.compiled import is_compiled
from .strategies.advice import Advice, CardPlan, Plan, Row
from .strategies.compiler import compile_rows
from .strategies.llm_settings import (Setting, copy_changed, kv_cache_bytes, kv_cache_notes,
                                      llm_settings, user_optimizer_on)
from .strategies.measure import Bench
from .strategies.optimizer import kind_of

__all__ = ["advise"]


def _parameter_bytes(model):
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.nelement() * t.element_size() for t in tensors)


def _data_bytes(inputs, target):
    """Bytes of the whole batch's tensors, inputs and target: kept out of
    the budget, as `memfit advise` keeps them. A plan in micro-batches is
    recorded on a micro-batch's data, while the whole batch stays on the
    device that memfit.Trainer (or a loop slicing it) splits."""
    return sum(t.nelement() * t.element_size() for t in tensors_in((inputs, target)))


@with_gc_frozen  # See Note [Long calls freeze the objects alive before them].
def advise(model: torch.nn.Module, inputs: Batch, target: Batch = None,
           loss_fn: LossFn | None = None, optimizer: OptimizerArg = "adam",
           budget: Size | None = None, batch_dim: int = 0,
           chain: Sequence[torch.nn.Module] | str | None = None,
           allow_approximate: bool = False, repeats: int = 1, mode: str = "cpu",
           progress: ProgressArg = None, settings: str | Sequence[Setting] = "auto",
           target_device: str | None = None, step: StepFn | None = None,
           compile: bool | None = None,
           cards: Sequence[Size] | None = None, set_to_none: bool = True,
           accumulation_steps: int = 1, zero_grad: str = "after_step",
           train_mode: bool = True, keep_output: bool = True) -> Advice:
    """Measure what lowers the memory of a training step of `model` on
    `inputs`, and plan the cheapest combination that fits `budget`.

    The strategies, each recorded with memfit.profile on the transformed
    step (two iterations):

    - zero_grad in place (set_to_none=False) against freeing the gradients;
    - activation checkpointing (torch.utils.checkpoint, non-reentrant, RNG
      preserved) over a chain of blocks: `chain=` an nn.Sequential /
      nn.ModuleList (or its path, "transformer.h") / list of the model's
      modules, else the longest such
      container found in the model; every block, sqrt(n), and the set the
      core's dynamic-programming planner picks from each block's recorded
      activations and forward time;
    - the optimizer's state and step on the host (memfit.offload);
    - bf16 autocast and a lighter optimizer (Adam -> SGD with momentum ->
      SGD): approximate, planned only with allow_approximate;
    - eval steps under no_grad and inference_mode: for comparison only;
    - settings: changes to a copy of the model or its optimizer.
      settings="auto" (the default) proposes, for an HF causal LM (a
      transformers *ForCausalLM), HF gradient checkpointing (exact), bf16
      weights, Adafactor, SGD and LoRA r=64/16/8 on q_proj and v_proj via
      peft (all on bf16 weights when the model's are fp32), and nothing for
      other models; None: none; or a list of
      memfit.strategies.llm_settings.Setting. Each is a row; the plan tries
      them after the state on the host (approximate ones with
      allow_approximate), each with every block checkpointed and halving
      micro-batches. The user's model is never changed: each setting is
      applied to a copy (on a real device, a copy of the weights).

    set_to_none, accumulation_steps, zero_grad, train_mode, keep_output: the
    loop you train with, as memfit.find_batch_size takes it; every row is
    recorded in that loop's shape, from the state the model and optimizer
    hold now.

    mode="cpu" records every row for real. mode="meta" records the rows on
    the meta device where the step allows (not bf16, not the state on the
    host, not eval steps): nothing is computed, the table marks them
    "(meta)", and each saving is against the plain step recorded on meta
    too; the plain step and the plan are still recorded for real. A model
    whose parameters are on the meta device (a model larger than the
    machine) is recorded on meta throughout: its plan is unverified, and
    the notes say so. Times are estimated from the recorded times (marked
    ~ in the table) except the plan's, timed over `repeats` steps against
    as many plain steps (repeats=0: estimated too). A meta model has no
    times: they are estimated from FLOPs counted on meta while each setting
    is first recorded (the table says so), micro-batches
    and the state on the host left out. A plan with a setting on a real
    model is not timed (it trains a changed copy).

    The plan halves the micro-batch from the whole batch and stops at the
    largest one where the plain step, else checkpointing, fits; then the
    state on the host; then the exact settings; then, with
    allow_approximate, the other settings, bf16 and lighter optimizers,
    with every block checkpointed. plan.micro_batch (0: whole) is what to
    give memfit.Trainer(micro_batch=...). The whole batch's data (inputs
    and target) is kept out of the budget, as `memfit advise` keeps it: a
    micro-batch's step is recorded on its own samples, while the batch it
    is cut from stays on the device. A model with BatchNorm in training is
    split only with allow_approximate, after the whole-batch plans that
    keep the numbers (each micro-batch gets its own statistics: See Note
    [Micro-batches of a model that mixes samples], advise_search.cpp).

    target_device: the device the budget is for, "cpu" or "cuda"; None:
    "cuda" when the model's parameters are on a CUDA device, else "cpu".
    For "cuda" each step is recorded as for a CUDA card (the optimizer as
    torch runs it there) and the budget is held against the caching
    allocator's reserved bytes replayed on it (they exceed the allocated
    bytes: cached segments that do not fit a later tensor); the table and
    every peak say so (advice.cuda_reserved). Plan a card from a meta model
    with target_device="cuda". progress: None, True (a line on
    stderr per recording) or a callable given each line. step: the user's
    own step, step(model, batch) -> loss, instead of loss_fn and target (as
    memfit.profile's; each setting's copy of the model is what it gets).
    compile: torch.compile's rows (None: for a compiled model; True: for
    an eager one too; False: none). A row for torch.compile itself (for a
    compiled model, its eager step beside it), and where the compiled step
    does not fit the budget, torch._functorch.config.activation_memory_budget
    planned in bytes: the largest fraction whose measured compiled step fits
    (See Note [The memory budget planned in bytes], strategies/compiler.py);
    advice.compile_rows, advice.compile_plan; apply(model) puts it on the
    model when the core's plan found nothing (apply(model,
    advice.compile_plan) always).
    cards: budgets of cards (["8GiB", "12GiB", ...]): "what fits on which
    card", each card's cheapest plan from the same recordings (See Note
    [What fits on which card]); advice.cards, advice.cards_table(),
    advice.apply_plan(model, optimizer, card="12GiB") (the card's setting,
    checkpointing and optimizer put on the model in one call; train with
    memfit.Trainer(micro_batch=...)). The budget may then be left out.
    An HF model whose config has use_cache=True keeps a KV cache through a
    training forward: each row's, the plan's and each card's
    kv_cache_bytes say how much of their peak it is.
    Returns an Advice: rows, plan, chain_plans, table(), to_json(),
    apply(model), apply_plan(model, optimizer). Raises memfit.DoesNotFit
    (a ValueError) when the budget is below the model's parameters or
    nothing recorded fits, naming the smallest peak reached and how; the
    exception's `advice` holds the rows.
    """
    req = _checked(model, inputs, target, loss_fn, optimizer, budget, batch_dim, mode,
                   repeats, cards, target_device, step, set_to_none, accumulation_steps,
                   zero_grad, train_mode, keep_output)
    proposed, notes = _proposals(model, inputs, settings, req, allow_approximate)
    found_chain = resolve_chain(model, chain)
    paths = found_chain.block_paths if found_chain else []
    bench = Bench(model, inputs, target, req.loss_fn, optimizer, batch_dim, paths,
                  max(1, req.repeats), req.target_device, loop=req.loop)
    recorder = _Recorder(bench, _SettingBenches(bench, proposed, paths), req, mode)
    native = _plan_natively(recorder, req, optimizer, proposed, allow_approximate, progress)
    crows, cplan = [], None
    wants_compile = is_compiled(model) if compile is None else bool(compile)
    if wants_compile and not recorder.on_meta:
        with kept_rng():
            crows, cplan, cnotes = compile_rows(model, bench, native.plain_peak, req.limit,
                                                allow_approximate,
                                                progress=as_progress(progress, "advise"))
        notes = notes + cnotes
    advice = _assembled(native, model, inputs, req, found_chain, proposed, notes,
                        recorder.benches, crows, cplan)
    if req.limit is not None and not advice.plan.found and not (cplan is not None
                                                                and cplan.found):
        raise _does_not_fit(advice)
    return advice


@dataclasses.dataclass
class _Request:
    """advise's arguments, checked: what every later step reads."""

    loss_fn: object  # the UserStep every row records
    target_device: str
    n: int  # the batch's samples
    limit: int | None  # the budget's bytes
    card_bytes: list
    repeats: int
    loop: object
    param_bytes: int
    user: str  # the user's optimizer, as kind_of names it
    data_bytes: int  # the whole batch's inputs and target: See _data_bytes
    mixing: str  # the BatchNorm layers the step trains, named; '': none (_mixing_layers)


def _checked(model, inputs, target, loss_fn, optimizer, budget, batch_dim, mode, repeats,
             cards, target_device, step, set_to_none, accumulation_steps, zero_grad,
             train_mode, keep_output=True):
    """advise's arguments checked at the door, each refused in one line."""
    repeats = count(repeats, "advise", "repeats", minimum=0)
    if mode not in ("cpu", "meta"):
        raise ValueError(f"[advise] mode must be 'cpu' or 'meta', got {mode!r}")
    check_optimizer(model, optimizer, "advise")
    loss_fn = as_user_step(loss_fn, step, "advise", model)  # the step every row records
    loss_fn.check_batch(model, inputs, target)
    target_device = budget_target(model, target_device, "advise")
    n = batch_size(inputs, batch_dim, "advise")
    limit = None if budget is None else to_bytes(budget, "advise")
    if isinstance(cards, (str, bytes, int, float)):
        raise TypeError(f"[advise] cards is a list of card budgets, got the "
                        f"{type(cards).__name__} {cards!r}: pass cards=[{cards!r}] "
                        f"(or several, cards=['8GiB', '12GiB'])")
    card_bytes = _card_bytes(cards)
    loop = as_loop(set_to_none, accumulation_steps, zero_grad, train_mode, "advise",
                   keep_output)
    return _Request(loss_fn, target_device, n, limit, card_bytes, repeats, loop,
                    _parameter_bytes(model), kind_of(optimizer), _data_bytes(inputs, target),
                    _mixing_layers(model, loop.train_mode))


def _mixing_layers(model, train_mode):
    """The BatchNorm layers the step runs in training, as one phrase ('':
    none): See Note [Micro-batches of a model that mixes samples]
    (advise_search.cpp). train_mode=True puts every module in training."""
    return _memfit.mixing_layers_phrase(
        [path or type(m).__name__ for path, m in model.named_modules()
         if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
         and (train_mode or m.training)])


def _card_bytes(cards):
    """The cards' budgets in bytes, each card once."""
    if isinstance(cards, dict):
        raise TypeError("[advise] cards is a list of card budgets, got a dict: pass "
                        "cards=list(your_dict.values()) (budgets like '12GiB')")
    card_bytes = [to_bytes(c, "advise") for c in (cards or [])]
    twice = sorted({b for b in card_bytes if card_bytes.count(b) > 1})
    if twice:
        raise ValueError(f"[advise] cards lists {_memfit.format_bytes(twice[0])} more than "
                         f"once: give each card once")
    return card_bytes


def _proposals(model, inputs, settings, req, allow_approximate):
    """The settings to record and the notes on them (the KV cache's
    first); refuses a budget below the weights no setting lightens."""
    limit = req.limit
    proposed, setting_notes = _settings_for(model, settings,
                                            min(req.card_bytes) if req.card_bytes else limit)
    setting_notes = kv_cache_notes(model, inputs) + setting_notes
    lighter_weights = allow_approximate and any(not st.exact for st in proposed)
    if limit is not None and limit < req.param_bytes and not lighter_weights:
        fb = _memfit.format_bytes
        raise DoesNotFit(
            f"[advise] the budget of {fb(limit)} is below the model's own parameters and "
            f"buffers, {fb(req.param_bytes)}: no strategy keeps less than the weights"
        )
    return proposed, setting_notes


class _Recorder:
    """What the core planner calls back (See Note [How advise plans]):
    record a variant at a batch, time it, or estimate its time from FLOPs
    counted on meta."""

    def __init__(self, bench, benches, req, mode):
        self.bench = bench
        self.benches = benches
        self.req = req
        self.mode = mode
        self.on_meta = any(p.is_meta for p in bench.model.parameters())
        self.paths = bench.block_paths
        # On meta a cheap recording and a real one are the same: each once.
        self.recorded = {}
        self.flops = {}  # id of a Bench -> (the Bench, its StepFlops): See _flop_ratio

    def record(self, variant, batch, cheap):
        s = _strategy(variant)
        on_meta, n = self.on_meta, self.req.n
        if on_meta and (s.autocast_bf16 or s.host_state or s.step != "train"):
            return ("the model's weights are on the meta device, where autocast does "
                    "nothing and eval steps and the host's state are not recorded")
        meta = on_meta or (cheap and self.mode == "meta" and s.step == "train" and not (
            s.autocast_bf16 or s.host_state))
        key = (s, batch)
        if meta and key in self.recorded:
            return self.recorded[key]
        try:
            b = self.benches.of(s)
            # See Note [FLOPs counted while a step is recorded]: the
            # setting's first recording on meta (the whole batch, nothing
            # checkpointed) counts the FLOPs its time estimate needs.
            count = (on_meta and id(b) not in self.flops and batch == n and not s.checkpoint
                     and s.step == "train")
            with counting_flops(b.block_paths) if count else contextlib.nullcontext() as fc:
                with unchecked() if meta else contextlib.nullcontext():  # the plan is, on the CPU
                    report = b.profile(s, batch, "meta" if meta else "cpu")
        except (TypeError, AttributeError, RuntimeError, ValueError) as e:
            if s.setting is None or isinstance(e, torch.OutOfMemoryError):
                raise
            # A setting the step does not take (the chunked loss where the
            # loss reads out.logits): a note, not a failure of advise.
            return f"the step fails under this setting: {type(e).__name__}: {e}"
        if count and fc.recorded and fc.complete:
            self.flops[id(b)] = (b, StepFlops.of(b.model, fc.forward, fc.backward, fc.blocks))
        out = report.native, report.timeline, meta
        if on_meta:
            self.recorded[key] = out
        return out

    def time_ratio(self, variant, micro_batch):
        s = _strategy(variant)
        if s.setting is not None:
            return -1.0  # a changed copy of the model: not timed against the user's
        return self.bench.time_ratio(s, micro_batch)

    def estimate_ratio(self, variant, micro_batch):
        return _flop_ratio(self.benches, self.flops, _strategy(variant), self.req.loss_fn,
                           len(self.paths))


def _plan_natively(recorder, req, optimizer, proposed, allow_approximate, progress):
    """The core planner's rows and plans, recorded through `recorder`."""
    user = req.user
    choices = _memfit.optimizer_choices(user)
    with kept_rng():
        relay = as_progress(progress, "advise").relay()
        planned = _memfit.AdviseSettings(
            batch=req.n, budget=-1 if req.limit is None else req.limit, optimizer=user,
            has_optimizer=optimizer is not None, can_offload=choices.can_offload,
            other_optimizers=choices.others, lighter=choices.lighter, chain=recorder.paths,
            settings=[_memfit.AdviseSetting(st.label, st.exact, st.checkpoints)
                      for st in proposed],
            allow_approximate=allow_approximate, cards=req.card_bytes,
            progress=_memfit.Progress() if relay is None else _memfit.Progress(relay))
        planned.reserve_bytes = req.data_bytes
        planned.split_changes = req.mixing
        timed = req.repeats > 0 and not recorder.on_meta
        return _memfit.plan_advice(
            recorder.record, planned, time_ratio=recorder.time_ratio if timed else None,
            estimate_ratio=recorder.estimate_ratio if recorder.on_meta else None,
            estimated_from="FLOPs counted on meta (forward, backward, recompute)")


def _assembled(native, model, inputs, req, found_chain, proposed, notes, benches, crows,
               cplan):
    """The Advice: the core's rows and plans as Python's, with the notes,
    the torch.compile rows and each row's KV cache."""
    limit = req.limit
    native.notes = native.notes + notes
    if native.plan.found and native.plan.variant.setting and native.plan.time_measured:
        native.notes = native.notes + [
            "the plan's time is not timed: it trains a changed copy of the model"]
    if native.plan.found and native.plan.micro_batch > 0 and req.mixing:
        native.notes = native.notes + [
            f"memfit.Trainer splits {req.mixing} only when told: pass it coupled='allow'"]
    native.model = type(model).__name__
    native.parameter_bytes = req.param_bytes
    if found_chain:
        native.chain_description = found_chain.describe()
    kv = functools.partial(_kv_cache_of, model, inputs, benches, req.n)
    rows = [_row(r, limit, kv) for r in native.rows]
    plan = _plan(native.plan, limit, kv)
    return Advice(
        native=native, model=native.model, batch=req.n, budget_bytes=limit,
        optimizer=req.user,
        parameter_bytes=req.param_bytes, plain_peak_bytes=native.plain_peak,
        cuda_reserved=native.cuda_reserved,
        plain_step_ms=native.plain_step_ms, chain=found_chain, segments=list(native.segments),
        chain_memory=native.chain_memory, chain_plans=list(native.chain_plans), rows=rows,
        plan=plan, notes=list(native.notes), settings=proposed, compile_rows=crows,
        compile_plan=cplan,
        cards=[CardPlan(c.budget, _plan(c.plan, c.budget, kv)) for c in native.cards],
    )


def _kv_cache_of(model, inputs, benches, n, s, micro_batch=0):
    """Bytes of the KV cache the step of strategy `s` keeps at `micro_batch`
    samples (0: the whole batch): on the copy its setting was recorded on
    (None when it was not made); eval steps keep it under HF checkpointing
    too."""
    if s.setting is not None:
        copy = benches.made_model(s.setting)
        if copy is None:
            return None
        model = copy
    return kv_cache_bytes(model, inputs, micro_batch if 0 < micro_batch < n else n,
                          training=s.step == "train")


def _settings_for(model, settings, budget_bytes):
    """The settings advise proposes, and notes on those it leaves out."""
    if isinstance(settings, str) and settings == "auto":
        return llm_settings(model, budget_bytes)
    if settings is None:
        return [], []
    if (not isinstance(settings, (list, tuple))
            or not all(isinstance(st, Setting) for st in settings)):
        raise ValueError(
            f"[advise] settings must be 'auto', None or a list of "
            f"memfit.strategies.llm_settings.Setting, got {settings!r}")
    labels = [st.label for st in settings]
    if len(set(labels)) != len(labels) or not all(labels):
        raise ValueError(f"[advise] settings need distinct, non-empty labels, got {labels}: "
                         f"name each setting once")
    return list(settings), []


class _SettingBenches:
    """The Bench of each setting: a copy of the model with the setting
    applied, made the first time the planner asks for it. Settings that
    change the model by the same function (bf16 weights with AdamW 8-bit,
    Adafactor or SGD) share one copy: they differ in the optimizer only; a
    setting with a base is recorded on its base's copy, its extra change
    made for each recording (See Note [Settings that share a copy])."""

    def __init__(self, bench, settings, paths):
        self.bench = bench
        self.settings = {st.label: st for st in settings}
        self.paths = paths
        self.made = {}
        self.copies = {}  # id of an apply function -> (the function, (copy, its prefix))

    def made_model(self, label):
        """The copy the setting `label` was recorded on, or None."""
        bench = self.made.get(label)
        return None if bench is None else bench.model

    def of(self, s):
        if s.setting is None:
            return self.bench
        if s.setting not in self.made:
            b = self.bench
            st = self.settings[s.setting]
            apply = st.base if st.base is not None else st.apply
            if id(apply) not in self.copies:
                self.copies[id(apply)] = (apply, copy_changed(b.model, apply))
            m, prefix = self.copies[id(apply)][1]
            around = None
            if st.base is not None:
                inner = m.get_submodule(prefix) if prefix else m
                around = functools.partial(_changed_while, inner, st.extra)
            opt = (st.optimizer(m, b.optimizer) if st.optimizer is not None
                   else user_optimizer_on(m, b.optimizer))
            paths = [f"{prefix}.{p}" if prefix else p for p in self.paths]
            self.made[s.setting] = Bench(m, b.inputs, b.target, b.loss_fn, opt, b.batch_dim,
                                         paths, b.repeats, b.target_device, around=around,
                                         loop=b.loop)
        return self.made[s.setting]


@contextlib.contextmanager
def _changed_while(model, extra):
    """`model` changed by extra(model) inside the block, undone after."""
    undo = extra(model)
    try:
        yield
    finally:
        undo()


def _flop_ratio(benches, flops, s, loss_fn, n_blocks):
    """Step FLOPs under strategy `s` over the plain step's, counted on meta
    (See Note [Time estimated from FLOPs and bytes]): the setting's forward
    and backward plus the forward of the blocks `s` checkpoints."""
    def counted(setting):
        b = benches.of(dataclasses.replace(Strategy(), setting=setting))
        if id(b) not in flops:  # counted while recorded, else here
            with b.as_recorded():
                flops[id(b)] = (b, count_step_flops(b.model, b.inputs, b.target, b.loss_fn))
        return flops[id(b)][1]

    plain, f = counted(None), counted(s.setting)
    total = f.forward + f.backward
    if s.checkpoint:
        blocks = list(f.blocks.values())
        if len(blocks) != n_blocks:  # a wrapper hid the chain: blocks share the forward
            blocks = [f.forward / max(1, n_blocks)] * n_blocks
        total += sum(blocks[i] for i in s.checkpoint)
    base = plain.forward + plain.backward
    return total / base if base > 0 else -1.0


def _strategy(variant):
    """The Python Strategy of the core's StepVariant."""
    return Strategy(checkpoint=tuple(i for i, c in enumerate(variant.checkpoint) if c),
                    autocast_bf16=variant.autocast_bf16,
                    zero_grad_in_place=variant.zero_grad_in_place,
                    optimizer=variant.optimizer or None, host_state=variant.host_state,
                    step=variant.step, setting=variant.setting or None,
                    setting_exact=variant.setting_exact)


def _row(r, limit, kv):
    s = _strategy(r.variant)
    return Row(r.name, r.kind, s, r.peak_bytes, r.saving_bytes,
               r.time_ratio if r.time_ratio >= 0 else None,
               None if limit is None else r.fits, r.variant.exact(),
               r.recompute_ns if r.recompute_ns >= 0 else None,
               r.predicted_peak_bytes if r.predicted_peak_bytes >= 0 else None,
               meta=r.meta, time_measured=r.time_measured, predicted=r.predicted,
               kv_cache_bytes=kv(s))


def _plan(p, limit, kv):
    s = _strategy(p.variant)
    return Plan(p.found and limit is not None, s, p.summary, p.peak_bytes,
                p.time_ratio if p.time_ratio >= 0 else None, p.exact, p.optimizer,
                micro_batch=p.micro_batch, time_measured=p.time_measured,
                kv_cache_bytes=kv(s, p.micro_batch))


def _does_not_fit(advice):
    """The core planner's line (See Note [How advise plans]), with the
    advice attached."""
    err = DoesNotFit("[advise] " + advice.native.does_not_fit)
    err.advice = advice
    return err
