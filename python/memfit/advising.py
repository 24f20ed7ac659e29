"""memfit.advise: when a step does not fit, each strategy that lowers its
memory measured on the user's own model, and the cheapest plan that fits.
The Python side of `memfit advise` (src/torch/strategies.cpp)."""

import statistics

import torch

from . import _memfit
from .batching import batch_size, count
from .device import to_bytes
from .fit import DoesNotFit
from .training_step import check_optimizer
from .strategies import INFERENCE_MODE, NO_GRAD, Strategy, resolve_chain
from .strategies.advice import Advice, Plan, Row
from .strategies.checkpoint import block_forward_ns, calibrate
from .strategies.measure import Bench, cuda_devices, sync
from .strategies.optimizer import LIGHTER, can_offload, kind_of

_NO_BUDGET = 1 << 62
# Measured times closer than this are the same to the plan (timing noise).
_SAME_TIME = 0.05


def _parameter_bytes(model):
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.nelement() * t.element_size() for t in tensors)


def advise(model, inputs, target=None, loss_fn=None, optimizer="adam", budget=None, batch_dim=0,
           chain=None, allow_approximate=False, repeats=2):
    """Measure what lowers the memory of a training step of `model` on
    `inputs`, and plan the cheapest combination that fits `budget`.

    Each strategy's peak comes from memfit.profile of the transformed step
    (two iterations, on the CPU), its time from `repeats` steps against as
    many plain steps in the same process:

    - zero_grad in place (set_to_none=False) against freeing the gradients;
    - activation checkpointing (torch.utils.checkpoint, non-reentrant, RNG
      preserved) over a chain of blocks: `chain=` an nn.Sequential /
      nn.ModuleList / list of the model's modules, else the longest such
      container found in the model; every block, sqrt(n), and the set the
      core's dynamic-programming planner picks from each block's measured
      activations and forward time;
    - the optimizer's state and step on the host (memfit.offload): the same
      training; planned only when nothing on the device alone fits, since
      its copies and CPU step cost far more beside a GPU than on this CPU;
    - bf16 autocast on the CPU and a lighter optimizer (Adam -> SGD with
      momentum -> SGD): approximate, planned only with allow_approximate;
    - eval steps under no_grad and inference_mode: for comparison only.

    When no single strategy the plan may use fits, every block checkpointed
    is measured combined with the others (zero_grad in place when it saves;
    the state on the host; bf16 and lighter optimizers with
    allow_approximate). The plan is the
    plain step when it fits, else the strategy (or combination) with the
    least measured time that fits, exact ones first; within 5% of the
    fastest, the one recomputing least.
    Returns an Advice: rows, plan, chain_plans, table(), to_json(),
    apply(model). Raises memfit.DoesNotFit (a ValueError) when the budget is
    below the model's parameters or nothing measured fits, naming the
    smallest peak reached and how; the exception's `advice` holds the rows.
    """
    repeats = count(repeats, "advise", "repeats")
    check_optimizer(model, optimizer, "advise")
    n = batch_size(inputs, batch_dim, "advise")
    limit = None if budget is None else to_bytes(budget, "advise")
    param_bytes = _parameter_bytes(model)
    fb = _memfit.format_bytes
    if limit is not None and limit < param_bytes:
        raise DoesNotFit(
            f"[advise] the budget of {fb(limit)} is below the model's own parameters and "
            f"buffers, {fb(param_bytes)}: no strategy keeps less than the weights"
        )
    found_chain = resolve_chain(model, chain)
    paths = found_chain.block_paths if found_chain else []
    bench = Bench(model, inputs, target, loss_fn, optimizer, batch_dim, paths, repeats)
    with torch.random.fork_rng(devices=cuda_devices(model)):
        state = _measure(model, inputs, bench, found_chain, optimizer, limit, allow_approximate)
    user_opt = kind_of(optimizer)
    plan = _choose(state, limit, allow_approximate, len(paths), user_opt)
    advice = Advice(
        model=type(model).__name__, batch=n, budget_bytes=limit, optimizer=user_opt,
        parameter_bytes=param_bytes, plain_peak_bytes=state["plain"].peak_bytes,
        plain_step_ms=state["plain_ms"], chain=found_chain, segments=state["segments"],
        chain_memory=state["memory"], chain_plans=state["chain_plans"], rows=state["rows"],
        plan=plan, notes=state["notes"],
    )
    if limit is not None and not plan.found:
        raise _does_not_fit(advice, state, allow_approximate)
    return advice


def _measure(model, inputs, bench, chain, optimizer, limit, allow_approximate):
    """Profiles and times every strategy; returns the rows and the chain."""
    rows, notes = [], []
    plain = bench.profile(Strategy())
    fits = (lambda peak: None) if limit is None else (lambda peak: peak <= limit)
    user = kind_of(optimizer)

    def measure(s, report=None):
        report = report or bench.profile(s)
        return report.peak_bytes, bench.time_ratio(s)

    def add(name, kind, s, report=None, **more):
        peak, ratio = measure(s, report)
        row = Row(name, kind, s, peak, plain.peak_bytes - peak, ratio, fits(peak),
                  s.exact, **more)
        rows.append(row)
        return row

    rows.append(Row("plain (zero_grad set_to_none)", "baseline", Strategy(), plain.peak_bytes, 0,
                    1.0, fits(plain.peak_bytes), True))
    if optimizer is not None:
        add("zero_grad in place", "memory", Strategy(zero_grad_in_place=True))
    else:
        notes.append("no optimizer: zero_grad in place and lighter optimizers do not apply")
    segments, memory, chain_plans = [], None, []
    if chain:
        segments, memory, chain_plans = _checkpoint_rows(model, inputs, bench, chain, plain,
                                                         limit, add, notes)
    else:
        notes.append("no chain of blocks (an nn.Sequential or nn.ModuleList of two or more "
                     "blocks with parameters): activation checkpointing does not apply; "
                     "pass chain=")
    add("autocast bf16 (CPU)", "precision", Strategy(autocast_bf16=True))
    if can_offload(optimizer):
        add(f"{user}'s state and step on the host (memfit.offload)", "optimizer",
            Strategy(host_state=True))
    if optimizer is not None:
        for name in ("adam", "momentum", "sgd"):
            if name != user and name != user.removesuffix("-offload"):
                add(f"optimizer {name} instead of {user}", "optimizer", Strategy(optimizer=name))
    add("eval step under no_grad", "eval", Strategy(step=NO_GRAD))
    add("eval step under inference_mode", "eval", Strategy(step=INFERENCE_MODE))

    # Combinations, measured only when no single strategy the plan may use fits.
    usable = [r for r in rows if r.kind != "eval" and (r.exact or allow_approximate)]
    if limit is not None and not any(r.fits for r in usable):
        every = tuple(range(len(chain))) if chain else ()
        in_place = any(r.kind == "memory" and r.saving_bytes > 0 for r in rows)
        combos = [Strategy(checkpoint=every, zero_grad_in_place=True)] if every and in_place else []
        if every and can_offload(optimizer):
            combos += [Strategy(checkpoint=every, host_state=True)]
        if allow_approximate:
            combos += [Strategy(checkpoint=every, autocast_bf16=True)] if every else []
            for name in LIGHTER.get(user, ["momentum", "sgd"]):
                combos += [Strategy(checkpoint=every, optimizer=name),
                           Strategy(checkpoint=every, autocast_bf16=True, optimizer=name)]
        for s in dict.fromkeys(combos):
            add(s.describe(len(every), user), "combination", s)
    plain_ms = statistics.median(bench.plain_ms)
    return dict(plain=plain, plain_ms=plain_ms, rows=rows, notes=notes,
                segments=segments, memory=memory, chain_plans=chain_plans)


def _checkpoint_rows(model, inputs, bench, chain, plain, limit, add, notes):
    """Rows for checkpointing every block, sqrt(n) and the planned set; the
    planner's chain and its rules compared."""
    n = len(chain)
    every = Strategy(checkpoint=tuple(range(n)))
    every_report = bench.profile(every)
    forward_ns = block_forward_ns(model, bench.inputs, chain.block_paths, bench.repeats,
                                  lambda: sync(bench.devices))
    segments, memory = calibrate(plain, every_report, chain.block_paths, forward_ns)
    target = _NO_BUDGET if limit is None else limit

    def flags(s):
        return [i in s.checkpoint for i in range(n)]

    def predicted(s):
        return dict(recompute_ns=_memfit.chain_recompute_ns(segments, flags(s)),
                    predicted_peak_bytes=_memfit.chain_peak(segments, memory, flags(s)))

    every_row = add(f"checkpoint every block ({n} of {n})", "checkpointing", every,
                    every_report, **predicted(every))
    sq = _memfit.chain_plan_sqrt(segments, memory, target)
    if 0 < sq.count() < n:
        s = Strategy(checkpoint=tuple(i for i, c in enumerate(sq.checkpointed) if c))
        add(f"checkpoint sqrt(n): blocks {sq.indices()}", "checkpointing", s, **predicted(s))
    if limit is None:
        notes.append("no budget: pass budget= for the planned checkpointing and a plan")
        return segments, memory, list(_memfit.compare_chain_plans(segments, memory, target))
    # See Note [Calibrating the chain from two profiles] (src/torch/strategies.cpp):
    # the plan is checked by profiling it, and the budget it is made for moved
    # by what the prediction missed or spared.
    best, best_peak = every, every_row.peak_bytes
    best_ns = predicted(every)["recompute_ns"] if best_peak <= limit else float("inf")
    tried, aim, first = {every.checkpoint}, limit, None
    for _ in range(4):
        cp = _memfit.chain_plan_optimal(segments, memory, aim)
        if not cp.fits:
            break
        s = Strategy(checkpoint=tuple(i for i, c in enumerate(cp.checkpointed) if c))
        first = first or (s, cp.predicted_peak)
        if s.checkpoint in tried:
            break
        tried.add(s.checkpoint)
        peak = bench.profile(s).peak_bytes
        if peak <= limit and cp.recompute_ns < best_ns:
            best, best_peak, best_ns = s, peak, cp.recompute_ns
        aim += limit - peak
    fb = _memfit.format_bytes
    if first and first[0] != best:
        notes.append(
            f"the planner's first choice, blocks {','.join(map(str, first[0].checkpoint))} "
            f"(predicted {fb(first[1])}), measured above the budget or costlier; the planned "
            f"row is the cheapest choice that measured within it")
    if best_peak <= limit and best.checkpoint:
        same = " (the same as every block)" if best == every else ""
        add(f"checkpoint planned: blocks {','.join(map(str, best.checkpoint)) or '-'}{same}",
            "checkpointing", best, **predicted(best))
    elif best_peak > limit:
        notes.append(f"no checkpointing choice fits {fb(limit)}: every block checkpointed "
                     f"peaks at {fb(every_row.peak_bytes)}")
    return segments, memory, list(_memfit.compare_chain_plans(segments, memory, target))


def _choose(state, limit, allow_approximate, n_blocks, user_opt):
    rows = state["rows"]
    plain = rows[0]

    def plan_of(r, found):
        opt = r.strategy.optimizer or user_opt
        if r.strategy.host_state:
            opt += "-offload"
        return Plan(found, r.strategy, r.strategy.describe(n_blocks, user_opt), r.peak_bytes,
                    r.time_ratio, r.exact, opt)

    if limit is None or plain.fits:
        return plan_of(plain, limit is not None)
    usable = [r for r in rows
              if r.kind != "eval" and r.fits and (r.exact or allow_approximate)]
    if not usable:  # the closest: the lowest peak the plan may use
        allowed = [r for r in rows if r.kind != "eval" and (r.exact or allow_approximate)]
        return plan_of(min(allowed, key=lambda r: r.peak_bytes), False)
    exact = [r for r in usable if r.exact]
    pool = exact or usable
    # The host's share is timed here with host and "device" in one memory;
    # beside a GPU its copies and CPU step cost far more: only when nothing
    # else fits.
    on_device = [r for r in pool if not r.strategy.host_state]
    pool = on_device or pool
    fastest = min(r.time_ratio for r in pool)
    # Within timing noise of the fastest, the least recomputation wins.
    close = [r for r in pool if r.time_ratio <= fastest * (1 + _SAME_TIME)]
    return plan_of(min(close, key=lambda r: (r.recompute_ns or 0, r.time_ratio)), True)


def _does_not_fit(advice, state, allow_approximate):
    fb = _memfit.format_bytes
    measured = [r for r in advice.rows if r.kind != "eval"]
    allowed = [r for r in measured if r.exact or allow_approximate]
    low = min(allowed, key=lambda r: r.peak_bytes)
    msg = (f"[advise] no strategy fits the budget of {fb(advice.budget_bytes)}: the smallest "
           f"peak memfit reached is {fb(low.peak_bytes)}, with {low.name} (plain step: "
           f"{fb(advice.plain_peak_bytes)})")
    lowest = min(measured, key=lambda r: r.peak_bytes)
    if lowest.peak_bytes < low.peak_bytes:
        msg += (f"; allow_approximate=True reaches {fb(lowest.peak_bytes)} with {lowest.name}, "
                f"changing the numbers")
    elif not allow_approximate and any(not r.exact for r in measured):
        msg += ("; allow_approximate=True also tries bf16 autocast and lighter optimizers "
                "combined with these, changing the numbers")
    outside = max(p["peak_bytes"] for p in state["plain"].phases
                  if p["name"] not in ("forward", "loss", "backward"))
    plain = state["plain"]
    cats = plain.categories_at_peak
    _, _, advice_text, fills, phase = _memfit.explain_oom(
        "advise", "", plain.peak_phase, parameters=cats["parameter"] + cats["buffer"],
        gradients=cats["gradient"], optimizer_state=cats["optimizer_state"],
        batch=cats["input"], activations=cats["activation"], temporaries=cats["temporary"],
        other=cats["other"], budget=advice.budget_bytes,
        state_on_host=advice.optimizer.endswith("-offload"))
    msg += (f". Whatever the batch, the plain step peaks at {fb(outside)} outside forward and "
            f"backward (parameters, gradients, optimizer state). The plain step peaks in "
            f"{phase}, with {fills}: {advice_text}")
    err = DoesNotFit(msg)
    err.advice = advice
    return err
