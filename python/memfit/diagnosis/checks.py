"""The checks: each reads a Run and returns the Findings of one kind (see
records.KINDS), every byte taken from the run.

Two kinds are optimizations rather than mistakes (tensors_kept,
not_in_place): they are reported only where the change lowers a step's
peak by at least MIN_SHARE of the memory in use then (the step's peak plus
the parameters, buffers and optimizer state made before the doctor
started), so that a loop written the usual way does not get a finding for a
tensor of a few bytes.
"""

import bisect
import collections
import statistics

from .._native import format_bytes
from .keepers import keeper_of
from .compile_checks import check_graph_breaks, check_recompiles
from .lifetimes import Run
from .observe import IN_PLACE_FIXES
from .records import UNKNOWN_SITE, Finding

__all__: list = []

# The least share of a step's peak an optimization finding must save.
MIN_SHARE = 0.05


def run_checks(run: Run):
    """Every finding of the run, largest saving first."""
    findings = []
    kept = list_kept(run)
    graph = check_graph_kept(run, kept)
    findings += graph
    growth = check_memory_growth(run, graph_explained=bool(graph), kept=kept)
    findings += growth
    # What a list keeps is growth's finding, at the line that appends it.
    skip = {f.where for f in growth} | {made for k in kept.values() for made in k.made}
    retained, retained_ids = check_retain_graph(run)
    findings += retained
    findings += check_tensors_kept(run, skip_sites=skip, skip_ids=retained_ids)
    findings += check_eval_with_grad(run)
    findings += check_grads_kept(run)
    findings += check_float64(run)
    findings += check_not_in_place(run)
    findings += check_pageable_copies(run)
    findings += check_recompiles(run)
    findings += check_graph_breaks(run)
    findings += check_kv_cache(run)
    findings.sort(key=lambda f: (f.estimated_saving, f.bytes), reverse=True)
    return findings


def _fmt(n):
    return format_bytes(int(round(n)))


def _slope(values):
    return (values[-1] - values[0]) / (len(values) - 1) if len(values) > 1 else 0.0


def _worth(saving, peak, run):
    """Whether a fix that lowers the steps' `peak` by `saving` is reported:
    by MIN_SHARE of the memory in use then, the state from before counted."""
    return saving > 0 and saving >= MIN_SHARE * (peak + run.observation.outside_bytes)


def _not_devices(run):
    """Allocations kept across steps that are no device memory of the loop:
    the inputs the doctor holds for its trials, what the user moved to the
    host (`.detach().cpu()`, a no-op on the CPU that rehearses the GPU)."""
    return run.observation.held_ids | run.observation.host_ids


def _steps_for_average(run):
    return run.steady_steps or run.steps


def _top(counter):
    return counter.most_common(1)[0][0]


# -- growth, graphs and tensors kept across steps ---------------------------


def _graph_uses(run):
    """Calls that took a tensor with an autograd graph from an earlier step:
    one every optimizer stepped after (a GAN's generator output, made before
    the discriminator's step and used after it, is of the same iteration)."""
    by_optimizer = collections.defaultdict(list)
    for m in run.observation.markers:
        if m.kind == "optimizer_step":
            by_optimizer[m.optimizer].append(m.event)
    out = []
    for u in run.observation.graph_uses:
        a = run.allocations.get(u.id)
        if a is None:
            continue
        made, used = run.step_of(a.alloc_event), run.step_of(u.event)
        if 0 <= made < used and all(
                bisect.bisect_right(e, u.event) > bisect.bisect_right(e, a.alloc_event)
                for e in by_optimizer.values()):
            out.append((u, a))
    return out


def _alive_at_ends(allocation, ends):
    """Indices k of the step ends (sorted event indices) at which
    `allocation` is alive."""
    lo = bisect.bisect_right(ends, allocation.alloc_event)
    free = allocation.free_event
    return range(lo, len(ends) if free is None else bisect.bisect_right(ends, free))


def _graph_alive_at_ends(run, steps, skip=frozenset()):
    ends = [s.end_event for s in steps]
    out = [0] * len(ends)
    for a in run.allocations.values():
        if a.in_graph and a.id not in skip:
            for k in _alive_at_ends(a, ends):
                out[k] += a.bytes
    return out


class ListKept:
    """What one line that appends a forward's result to a list
    (`outputs.append(out)`, keepers.py) keeps: the allocations of the
    forwards whose result it appends (their outputs, and the autograd graph
    behind them), the lines that made them, and those allocated at those
    lines (the value the line assigns among them)."""

    def __init__(self, keeper):
        self.keeper = keeper
        self.ids = set()
        self.made = set()
        self.at_line = []

    def scalar(self, event):
        """Whether what the lines assign, alive after `event`, is one number
        each (`.item()` keeps it)."""
        alive = [a for a in self.at_line if a.alive_after(event)]
        return bool(alive) and all(a.bytes <= 16 for a in alive)


def list_kept(run):
    """{the appending line: ListKept} of the run (see ListKept)."""
    forwards = run.observation.forwards
    starts = [f.first_event for f in forwards]
    held = _not_devices(run)
    keepers = {}
    kept = {}
    for a in run.allocations.values():
        if a.id in held:
            continue
        if a.forward is None and not a.in_graph:
            continue
        # A forward's output and its graph: the line that called it; a
        # tensor computed with grad outside a forward: its own line.
        f = _forward_of(forwards, starts, a.alloc_event) if a.forward is None else None
        made = f.site if f is not None else a.site
        if made is UNKNOWN_SITE:
            continue
        if made not in keepers:
            keepers[made] = keeper_of(made)
        k = keepers[made]
        if k is None:
            continue
        entry = kept.setdefault(k.site, ListKept(k))
        entry.ids.add(a.id)
        entry.made.add(made)
        if a.site == made:
            entry.at_line.append(a)
    return kept


def check_graph_kept(run, kept=None):
    """`total += loss`: a tensor that requires grad carried from one step into
    the next, so that every step's graph hangs on it. What a list keeps
    (list_kept) is memory_growth's, at the line that appends it."""
    uses = _graph_uses(run)
    if not uses:
        return []
    kept = list_kept(run) if kept is None else kept
    steps = run.steps
    graph = _graph_alive_at_ends(run, steps[1:] or steps,
                                 {i for k in kept.values() for i in k.ids})
    per_step = max(_slope(graph), 0.0)
    by_site = collections.defaultdict(list)
    for u, a in uses:
        by_site[u.site].append((u, a))
    findings = []
    for site, items in by_site.items():
        u, a = items[0]
        in_steps = max(len({run.step_of(x.event) for x, _ in items} & set(range(len(steps)))), 1)
        scalar = a.bytes <= 16
        seen = (f"`{u.func}` at {site} takes a tensor that requires grad from an earlier "
                f"step (made at {a.site}) in {in_steps} of {len(steps)} steps, so each step's "
                "autograd graph hangs on it. ")
        if per_step > 0:
            seen += ("Memory of autograd graphs still alive after each step: "
                     + ", ".join(_fmt(v) for v in graph) + f" (+{_fmt(per_step)} per step).")
        else:
            seen += ("Backward already freed what those graphs saved, so no tensor bytes are "
                     "held, but their nodes (host memory) pile up with every step and a "
                     "backward through it would fail.")
        fix = ("accumulate a number: `total += loss.item()`" if scalar else
               "carry a detached tensor into the next step: `x = x.detach()`")
        findings.append(Finding("graph_kept", int(per_step), site, seen, fix, int(per_step)))
    return findings


def check_memory_growth(run, graph_explained=False, kept=None):
    """Live memory at the end of every step above the step before, with the
    lines whose allocations stay alive; what a list keeps (list_kept) at
    the line that appends it. A last step cut at the loop's last torch call
    is left out: its end counts that line's temporaries too."""
    steps = run.steady_steps[:-1] if run.last_step_cut else run.steady_steps
    if len(steps) < 3:
        return []
    live = [s.live_after for s in steps]
    if not all(b > a for a, b in zip(live, live[1:])):
        return []
    held = _not_devices(run)
    kept = list_kept(run) if kept is None else kept
    kept_by = {i: site for site, k in kept.items() for i in k.ids}
    hooked = dict(run.observation.hook_outputs)
    n = len(steps)
    by_hook = collections.defaultdict(lambda: [0] * n)
    by_keeper = collections.defaultdict(lambda: [0] * n)
    by_site = collections.defaultdict(lambda: [0] * n)
    funcs = collections.defaultdict(collections.Counter)
    graph = [0] * n
    graph_sites = collections.Counter()
    forwards = run.observation.forwards
    starts = [f.first_event for f in forwards]
    ends = [s.end_event for s in steps]
    for a in run.allocations.values():
        if a.id in held:
            continue
        for k in _alive_at_ends(a, ends):
            if a.id in kept_by:  # before a hook's: a hook that logs sees the output too
                by_keeper[kept_by[a.id]][k] += a.bytes
            elif a.id in hooked:
                by_hook[hooked[a.id]][k] += a.bytes
            elif a.in_graph:
                graph[k] += a.bytes
                if k == n - 1:
                    f = _forward_of(forwards, starts, a.alloc_event)
                    graph_sites[f.site if f else a.site] += a.bytes
            else:
                by_site[a.site][k] += a.bytes
                if k == n - 1:
                    funcs[a.site]["the forward's output" if a.forward is not None
                                  else f"what `{a.func or 'the call'}` allocates"] += a.bytes
    graph_slope = 0.0 if graph_explained else max(_slope(graph), 0.0)
    if graph_explained:
        for u, _a in _graph_uses(run):
            by_site.pop(u.site, None)
    growing = sorted(((_slope(v), site) for site, v in by_site.items()
                      if v[-1] > v[0] and all(b >= a for a, b in zip(v, v[1:]))),
                     key=lambda x: x[0], reverse=True)
    trend = ", ".join(_fmt(v) for v in live) + f" (+{_fmt(_slope(live))} per step)"
    findings = _hook_growth(by_hook, steps, trend)
    findings += _keeper_growth(by_keeper, kept, steps, trend)
    for i, (slope, site) in enumerate(growing):
        per = slope + (graph_slope if i == 0 else 0.0)
        seen = (f"live memory after steps {steps[0].index}..{steps[-1].index}: {trend}. "
                f"{_capital(_top(funcs[site]))} at {site} stays alive: "
                f"+{_fmt(slope)} per step")
        if i == 0 and graph_slope > 0:
            seen += f", with +{_fmt(graph_slope)} per step of autograd graph memory it keeps"
        seen += "."
        fix = ("keep a number or a detached host copy instead of the tensor "
               "(`.item()`, `.detach().cpu()`), or drop the reference")
        findings.append(Finding("memory_growth", int(per), site, seen, fix, int(per)))
    if not growing and graph_slope > 0:
        site = _top(graph_sites) if graph_sites else UNKNOWN_SITE
        seen = (f"live memory after steps {steps[0].index}..{steps[-1].index}: {trend}; "
                f"the autograd graphs of the forward at {site} stay alive "
                f"(+{_fmt(graph_slope)} per step): something keeps a tensor computed with grad.")
        trained = any(f.site == site and f.backward_reached for f in forwards)
        fix = ("keep `.detach().cpu()` copies (or `.item()` numbers) of what is stored across "
               "steps, not the tensor" if trained else
               "run it under `torch.no_grad()`, or keep `.detach()`ed results")
        findings.append(Finding("memory_growth", int(graph_slope), site, seen, fix,
                                int(graph_slope)))
    return findings


def _keeper_growth(by_keeper, kept, steps, trend):
    """memory_growth of what a line keeps in a list (list_kept): {the
    appending line: bytes it keeps alive at each step's end}."""
    findings = []
    for site, v in by_keeper.items():
        slope = _slope(v)
        if not (v[-1] > v[0] and all(b >= a for a, b in zip(v, v[1:]))):
            continue
        k = kept[site]
        c, name = k.keeper.container, k.keeper.name
        made = ", ".join(sorted(str(m) for m in k.made))
        seen = (f"live memory after steps {steps[0].index}..{steps[-1].index}: {trend}. "
                f"`{c}` at {site} keeps each step's `{name}` (made at {made}): "
                f"+{_fmt(slope)} per step"
                + (" (detached: its tensor alone)." if k.keeper.detached
                   else ", with the autograd graph it hangs on."))
        if k.scalar(steps[-1].end_event - 1):
            fix = f"keep the number: `{k.keeper.keeping(name + '.item()')}`"
        else:
            fix = (f"keep a host copy without its graph: "
                   f"`{k.keeper.keeping(name + '.detach().cpu()')}` "
                   f"(or only the numbers you need from it)")
        findings.append(Finding("memory_growth", int(slope), site, seen, fix, int(slope)))
    return findings


def _hook_growth(by_hook, steps, trend):
    """memory_growth of what a forward hook of the user's keeps: {the hook's
    line: bytes of its module's outputs alive at each step's end}."""
    findings = []
    for site, v in by_hook.items():
        if not (v[-1] > v[0] and all(b >= a for a, b in zip(v, v[1:]))):
            continue
        slope = _slope(v)
        seen = (f"live memory after steps {steps[0].index}..{steps[-1].index}: {trend}. "
                f"The forward hook at {site} keeps what its module returns: "
                f"+{_fmt(slope)} per step.")
        fix = ("keep a host copy or the numbers you need in the hook "
               "(`acts.append(output.detach().cpu())`), and empty it once used or remove the "
               "hook (`handle.remove()`)")
        findings.append(Finding("memory_growth", int(slope), site, seen, fix, int(slope)))
    return findings


def _capital(text):
    return text[:1].upper() + text[1:]


def _forward_of(forwards, starts, event):
    """The forward running at `event` (`starts`: each one's first event)."""
    i = bisect.bisect_right(starts, event) - 1
    return forwards[i] if i >= 0 and event < forwards[i].end_event else None


def _peak_without(run, step, intervals):
    """The step's peak with `intervals` ((first_event, end_event, bytes))
    not allocated."""
    first, end = step.first_event, min(step.end_event, len(run.live))
    if end <= first or not any(a <= step.peak_event < b for a, b, _n in intervals):
        return step.peak  # the peak's first event keeps its bytes: the peak stays
    delta = [0] * (end - first + 1)
    for a, b, nbytes in intervals:
        a, b = max(a, first), min(b, end)
        if a < b:
            delta[a - first] += nbytes
            delta[b - first] -= nbytes
    # What the step began with counts without the intervals alive then.
    peak = run.live_before(first) - sum(n for a, b, n in intervals if a < first <= b)
    cut = 0
    for e in range(first, end):
        cut += delta[e - first]
        peak = max(peak, run.live[e] - cut)
    return peak


_WEIGHTS_FIX = ("keep the copy on the host: `best = {k: v.detach().cpu().clone() for k, v in "
                "model.state_dict().items()}` (model.load_state_dict(best) puts it back)")


def check_tensors_kept(run, skip_sites=(), skip_ids=frozenset()):
    """Tensors of step k still alive at step k+1's peak (the output of the
    last step held while the next forward runs, a batch kept aside), where
    dropping them earlier lowers that peak. `skip_ids`: allocations another
    finding names (a graph retain_graph=True kept)."""
    steps = run.steps
    if len(steps) < 3:
        return []
    obs = run.observation
    excluded = _not_devices(run)
    # Gradients and optimizer state are made by backward and the optimizer's
    # step, and kept on purpose (grads_kept is about gradients kept too long).
    state_calls = ("Tensor.backward", "optimizer.step")
    # Graph memory of a forward no backward used is eval_with_grad's.
    unused_graph = {run.step_of(f.first_event) for f in obs.forwards
                    if f.grad_enabled and f.has_graph and not f.backward_reached}
    per_site = collections.defaultdict(lambda: collections.defaultdict(int))
    savings = collections.defaultdict(list)
    peaks = []
    funcs = {}
    made_in = collections.defaultdict(list)  # step -> what it made and left alive
    hooked = dict(obs.hook_outputs)  # what a hook keeps is named at the hook's line
    kept_allocs = collections.defaultdict(list)  # site -> what it kept, every step
    for a in run.allocations.values():
        k = run.step_of(a.alloc_event)
        if 0 <= k < len(steps) and (a.free_event is None or a.free_event >= steps[k].end_event):
            made_in[k].append(a)
    for k in range(1, len(steps) - 1):
        nxt = steps[k + 1]
        peaks.append(nxt.peak)
        p = nxt.peak_event
        # A forward's inputs, made before it began, are the next step's.
        inputs = {i for f in obs.forwards if run.step_of(f.first_event) == k + 1
                  for i in f.input_ids}
        kept = collections.defaultdict(list)
        for a in made_in[k]:
            site = hooked.get(a.id, a.site)
            if (a.id in excluded or a.id in inputs or a.id in skip_ids or site in skip_sites
                    or a.func in state_calls
                    or a.site is UNKNOWN_SITE or not a.alive_after(p)
                    or (a.in_graph and k in unused_graph)):
                continue
            kept[site].append(a)
            funcs.setdefault(site, a)
            kept_allocs[site].append(a)
        for site, allocs in kept.items():
            per_site[site][k] = sum(a.bytes for a in allocs)
            intervals = [(nxt.first_event, a.free_event if a.free_event is not None
                          else nxt.end_event, a.bytes) for a in allocs]
            savings[site].append(nxt.peak - _peak_without(run, nxt, intervals))
    findings = []
    n = len(steps) - 2
    mean_peak = statistics.mean(peaks)
    for site, by_step in per_site.items():
        weights = all(x.id in obs.weight_copies for x in kept_allocs[site])
        saving = _weights_saving(run, site) if weights else sum(savings[site]) / n
        if not _worth(saving, mean_peak, run):
            continue
        per = sum(by_step.values()) / n
        if weights:
            seen = (f"the copy of the model's weights made at {site} ({_fmt(per)} per step) "
                    f"stays on the device across steps (in {len(by_step)} of {n} steps), the "
                    f"next copy made beside it; on the host, the steps' peak "
                    f"({_fmt(max(s.peak for s in steps))}) falls by {_fmt(saving)}.")
            findings.append(Finding("tensors_kept", int(per), site, seen, _WEIGHTS_FIX,
                                    int(saving)))
            continue
        a = funcs[site]
        hook = site in hooked.values()
        what = (f"what the forward hook at {site} keeps of its module's output" if hook
                else f"the output of the forward at {site}" if a.forward is not None
                else f"what `{a.func or 'the call'}` at {site} allocates")
        seen = (f"{what} in one step ({_fmt(per)}) is still alive at the next step's peak "
                f"(in {len(by_step)} of {n} steps); freed before it, that peak "
                f"({_fmt(mean_peak)}) falls by {_fmt(saving)}.")
        fix = ("keep a host copy or the numbers you need in the hook "
               "(`.detach().cpu()`), or drop it once used" if hook else
               "drop it once used: `del out, loss` at the end of the loop body (or keep "
               "`.item()` / `.detach().cpu()` instead)")
        findings.append(Finding("tensors_kept", int(per), site, seen, fix, int(saving)))
    return findings


def _weights_saving(run, site):
    """What keeping the copies of the weights made at `site` on the host
    takes off the steps' peak: every copy gone, also the new one made while
    the last is still alive (`best = copy.deepcopy(model)`)."""
    intervals = [(a.alloc_event, _end_of(run, a), a.bytes) for a in run.allocations.values()
                 if a.id in run.observation.weight_copies and a.site == site]
    steps = run.steps
    return max(s.peak for s in steps) - max(_peak_without(run, s, intervals) for s in steps)


# -- autograd and gradients ---------------------------------------------------


def _retained_allocations(run, rb, reached):
    """What the graph of the forwards `reached` by the backward `rb` saved
    and still holds after it: allocated from the first of them to the
    backward (the loss's own saved tensors too), in a graph, not a forward's
    output (the user holds that), alive once the backward returned."""
    first = min(f.first_event for f in reached)
    held = run.observation.held_ids
    return [a for a in run.allocations.values()
            if first <= a.alloc_event < rb.first_event and a.in_graph and a.forward is None
            and a.id not in held and a.alive_at_boundary(rb.end_event)]


def check_retain_graph(run):
    """`loss.backward(retain_graph=True)` where no later backward goes
    through the same forward: the graph keeps every tensor it saved until
    the user drops the loss and output (usually at the next iteration's
    assignment, after the next forward made its own activations). Returns
    (findings, the ids of the allocations they name). Reported where
    freeing them as backward runs lowers the steps' peak by MIN_SHARE of
    the memory in use."""
    obs = run.observation
    steps = _steps_for_average(run)
    if not obs.retained or not steps:
        return [], set()
    by_site = collections.defaultdict(list)
    for rb in obs.retained:
        reached = [f for f in obs.forwards
                   if any(rb.first_event <= e < rb.end_event for e in f.backward_events)]
        if not reached or any(e >= rb.end_event for f in reached for e in f.backward_events):
            continue  # used again by a later backward (two losses, a penalty): on purpose
        allocs = _retained_allocations(run, rb, reached)
        if allocs:
            # Without retain_graph a node frees what it saved once it ran: its
            # result then (the ops that read it ran before it, in backward).
            released = dict(rb.released)
            by_site[rb.site].append((allocs, [(released.get(a.id, rb.end_event),
                                               _end_of(run, a), a.bytes) for a in allocs]))
    peak = max(s.peak for s in steps)
    findings, ids = [], set()
    for site, items in by_site.items():
        intervals = [iv for _allocs, ivs in items for iv in ivs]
        saving = peak - max(_peak_without(run, s, intervals) for s in steps)
        if not _worth(saving, peak, run):
            continue
        per = statistics.mean(sum(a.bytes for a in allocs) for allocs, _ivs in items)
        ids |= {a.id for allocs, _ivs in items for a in allocs}
        n = len(items)
        seen = (f"backward(retain_graph=True) at {site} keeps what the graph saved "
                f"({_fmt(per)}) alive after it, in {n} backward{'s' if n > 1 else ''}, "
                "and no later backward goes through that graph: it lives until the loss "
                "and output are dropped (into the next forward); freed as backward runs "
                f"through it, the steps' peak falls by {_fmt(saving)}.")
        fix = ("call `loss.backward()` without retain_graph=True (it is for a second "
               "backward through the same graph)")
        findings.append(Finding("retain_graph", int(per), site, seen, fix, int(saving)))
    return findings, ids


def check_eval_with_grad(run):
    """A forward with grad enabled whose graph no backward ever used: what it
    kept for backward (allocated in the forward, alive when it returned, not
    its output) was held for nothing."""
    obs = run.observation
    by_forward = collections.defaultdict(int)
    idle = {f.index: f for f in obs.forwards
            if f.grad_enabled and f.has_graph and not f.backward_reached}
    if not idle:
        return []
    starts = sorted((f.first_event, f.index) for f in idle.values())
    firsts = [s for s, _ in starts]
    made = collections.defaultdict(list)  # forward index -> its allocations
    for a in run.allocations.values():
        i = bisect.bisect_right(firsts, a.alloc_event) - 1
        if i >= 0 and a.alloc_event < idle[starts[i][1]].end_event:
            made[starts[i][1]].append(a)
    # Under no_grad an activation goes once the next op made its result; the
    # graph holds it until the output goes: what no_grad frees is in between.
    freed = collections.defaultdict(list)
    for index, allocs in made.items():
        f = idle[index]
        allocs.sort(key=lambda a: a.alloc_event)
        for k, a in enumerate(allocs):
            if a.forward != f.index and a.alive_at_boundary(f.end_event):
                by_forward[index] += a.bytes
                start = allocs[k + 1].alloc_event + 1 if k + 1 < len(allocs) else f.end_event
                freed[index].append((start, _end_of(run, a), a.bytes))
    for index, (nbytes, ins) in _inputs_held(run, idle).items():
        if nbytes:
            by_forward[index] += nbytes
            freed[index] += [(idle[index].end_event, _end_of(run, a), a.bytes) for a in ins]
    groups = collections.defaultdict(list)
    for index, nbytes in by_forward.items():
        groups[idle[index].site].append(index)
    steps = _steps_for_average(run)
    findings = []
    for site, indices in groups.items():
        per = statistics.mean(by_forward[i] for i in indices)
        intervals = [iv for i in indices for iv in freed[i]]
        saving = (max(s.peak for s in steps)
                  - max(_peak_without(run, s, intervals) for s in steps))
        seen = (f"{len(indices)} forward(s) at {site} ran with grad enabled and no backward "
                f"followed; each kept {_fmt(per)} of activations for a backward that never "
                f"came, held as long as its output lives; freed as they are used (no_grad), "
                f"the steps' peak falls by {_fmt(saving)}.")
        fix = "run it under `with torch.no_grad():` (or `torch.inference_mode()`)"
        findings.append(Finding("eval_with_grad", int(per), site, seen, fix, int(saving)))
    return findings


def _end_of(run, a):
    return a.free_event if a.free_event is not None else len(run.live)


def _grads_saving(run, forward, zero_grad, late, keep):
    """What the step of `forward` would peak lower without the gradients
    alive through it: from the step's start (zero_grad moved right after
    optimizer.step()) or from `zero_grad` (set_to_none=True there), until
    zero_grad freed them, or, where they were only zeroed, until backward
    wrote each one (Observation.accumulations)."""
    step = run.steps[run.step_of(forward.first_event)]
    start = step.first_event if late or zero_grad is None else zero_grad.event
    if zero_grad is not None and not keep:
        intervals = [(start, zero_grad.event, forward.grad_bytes_present)]
    else:
        written = {}
        for event, param, nbytes in run.observation.accumulations:
            if start <= event < step.end_event:
                written.setdefault(param, (event, nbytes))
        intervals = [(start, event, nbytes) for event, nbytes in written.values()]
        if not intervals:  # no backward wrote them: alive through the forward at least
            intervals = [(start, forward.end_event, forward.grad_bytes_present)]
    intervals = [iv for iv in intervals if iv[1] > iv[0]]
    if not intervals:
        return 0
    return step.peak - _peak_without(run, step, intervals)


def _inputs_held(run, idle):
    """{forward index: (bytes, allocations) of its inputs made on its own line
    (`model(x * 2)`, `model(x.to(device))`) that its graph keeps}. The
    doctor holds each line's last inputs for its trials until that line's
    next forward begins: one the graph keeps outlives that forward, one it
    does not is freed as it begins. The last forward of a line is judged as
    the one before it."""
    by_site = collections.defaultdict(list)
    for f in sorted(idle.values(), key=lambda f: f.first_event):
        by_site[f.site].append(f)
    later = collections.defaultdict(list)
    for f in run.observation.forwards:
        later[f.site].append(f)
    held = {}
    for site, fs in by_site.items():
        kept = False
        for f in fs:
            nxt = next((g for g in later[site] if g.first_event > f.first_event), None)
            ins = [run.allocations.get(i) for i in set(f.input_ids)]
            ins = [a for a in ins if a is not None and a.site == site and a.forward is None
                   and a.alloc_event < f.first_event]
            if nxt is not None and ins:
                kept = all(a.free_event is None or a.free_event >= nxt.end_event for a in ins)
            held[f.index] = (sum(a.bytes for a in ins), ins) if kept else (0, [])
    return held


def check_grads_kept(run):
    """Last step's gradients alive through the next forward: zero_grad called
    after the forward, or zeroing without freeing (set_to_none=False). An
    optimization where the step's peak lies in backward (the gradients are
    made there anyway): reported where freeing them earlier lowers the peak
    by MIN_SHARE of the memory in use, with that saving."""
    if run.step_kind != "optimizer step":
        return []
    measured = [f for f in run.observation.forwards
                if f.grad_bytes_present is not None
                and 1 <= run.step_of(f.first_event) < len(run.steps)]
    present = [f for f in measured if f.grad_bytes_present > 0]
    if not present or 2 * len(present) < len(measured):
        return []
    per = statistics.mean(f.grad_bytes_present for f in present)
    zeroing = [z for z in run.observation.zero_grads if run.step_of(z.event) >= 1]
    keep = [z for z in zeroing if not z.set_to_none]
    late = [z for z in zeroing if any(run.step_of(f.first_event) == run.step_of(z.event)
                                      and f.first_event < z.event for f in present)]
    savings = []
    for f in present:
        k = run.step_of(f.first_event)
        z = next((z for z in zeroing if run.step_of(z.event) == k), None)
        savings.append(_grads_saving(run, f, z, z in late or z is None, z in keep))
    saving = statistics.mean(savings)
    in_use = statistics.mean(run.steps[run.step_of(f.first_event)].peak for f in present)
    if not _worth(saving, in_use, run):
        return []
    f0 = present[0]
    lowers = f"; freed before it, the step's peak falls by {_fmt(saving)}"
    if keep:
        site = _top(collections.Counter(z.site for z in keep))
        seen = (f"zero_grad(set_to_none=False) at {site} zeroes the gradients but keeps them: "
                f"{_fmt(per)} of .grad tensors are alive when the forward at {f0.site} begins, "
                f"in {len(present)} of {len(measured)} steps{lowers}.")
        fix = ("optimizer.zero_grad(set_to_none=True) (the default since torch 2.0); to keep "
               "this loop, size its batch for it: memfit.find_batch_size(..., "
               "set_to_none=False)")
    elif late:
        site = _top(collections.Counter(z.site for z in late))
        seen = (f"zero_grad() at {site} runs after the forward at {f0.site}, so the last step's "
                f"gradients ({_fmt(per)}) are alive through it, in {len(present)} of "
                f"{len(measured)} steps{lowers}.")
        fix = ("call zero_grad() before the forward (right after optimizer.step()); to keep "
               "this loop, size its batch for it: memfit.find_batch_size(..., "
               "zero_grad='before_backward')")
    else:
        site = f0.site
        seen = (f"no zero_grad() ran between optimizer.step() and the forward at {site}: "
                f"{_fmt(per)} of gradients are alive through it (and keep accumulating)"
                f"{lowers}.")
        fix = "call optimizer.zero_grad() right after optimizer.step()"
    return [Finding("grads_kept", int(per), site, seen, fix, int(saving))]


# -- tensors the step makes -------------------------------------------------


def check_float64(run):
    """float64 tensors made in the step: twice the bytes of float32."""
    steps = _steps_for_average(run)
    wanted = {s.index for s in steps}
    by_step = collections.defaultdict(list)
    for r in run.observation.float64:
        s = run.step_of(r.event)
        if s in wanted:
            by_step[s].append(r)
    if not by_step:
        return []
    per_site = collections.Counter()
    origins = collections.Counter()
    for s, records in by_step.items():
        records.sort(key=lambda r: r.event)
        origins[(records[0].site, records[0].func)] += 1
        for r in records:
            a = run.allocations.get(r.id)
            per_site[r.site] += a.bytes if a is not None else r.bytes
    total = sum(per_site.values()) / len(steps)
    site, func = _top(origins)
    count = sum(len(v) for v in by_step.values()) / len(steps)
    others = [f"{s} ({_fmt(b / len(steps))})" for s, b in per_site.most_common(4) if s != site]
    seen = (f"{count:g} float64 tensor(s) per step ({_fmt(total)}), the first taken or made "
            f"by `{func}` at {site}")
    seen += (", then at " + ", ".join(others) + ".") if others else "."
    fix = ("make it float32 where it is created: `.float()`, `dtype=torch.float32` "
           "(torch.from_numpy and torch.tensor of Python floats give float64)")
    return [Finding("float64", int(total), site, seen, fix, int(total // 2))]


def check_not_in_place(run):
    """Out-of-place activations and adds whose input nothing else used: in
    place, the result would reuse the input's memory. Two such ops can make
    equal peaks, so that each alone saves nothing: a line is then reported
    with what the changes save together, and says so."""
    steps = run.steps
    if not steps:
        return []
    groups = collections.defaultdict(lambda: collections.defaultdict(list))
    modules = collections.defaultdict(set)
    for c in run.observation.in_place:
        if c.used_later:
            continue
        x, out = run.allocations.get(c.input_id), run.allocations.get(c.output_id)
        if x is None or out is None:
            continue
        s = run.step_of(c.event)
        if not 0 <= s < len(steps) or run.step_of(x.alloc_event) != s:
            continue
        end = x.free_event if x.free_event is not None else steps[s].end_event
        groups[(c.site, c.func)][s].append((out.alloc_event, end, min(x.bytes, out.bytes)))
        if c.module:
            modules[(c.site, c.func)].add(c.module)
    if not groups:
        return []
    wanted = [s.index for s in _steps_for_average(run)]
    mean_peak = statistics.mean(steps[i].peak for i in wanted)

    def saving(keys):
        return statistics.mean(
            steps[i].peak
            - _peak_without(run, steps[i], [iv for k in keys for iv in groups[k].get(i, ())])
            for i in wanted)

    every = list(groups)
    together = saving(every)
    findings = []
    for key in every:
        site, func = key
        alone = saving([key])
        marginal = together - saving([k for k in every if k != key])
        if _worth(alone, mean_peak, run):
            estimate, how = alone, ""
        elif marginal > 0 and _worth(together, mean_peak, run):
            others = sorted({str(k[0]) for k in every if k != key})
            estimate = together
            how = f" together with the same change at {', '.join(others)}" if others else ""
        else:
            continue
        per = statistics.mean(sum(b for _a, _e, b in groups[key].get(i, ())) for i in wanted)
        mods = sorted(modules[key])
        where = (f" (modules {', '.join(mods)})" if len(mods) > 1
                 else f" (module {mods[0]})" if mods else "")
        seen = (f"`{func}` at {site}{where} allocates {_fmt(per)} per step for its result "
                "while its input, which nothing else uses (no view, not saved for backward), stays "
                f"alive; in place{how}, the step's peak ({_fmt(mean_peak)}) falls by "
                f"{_fmt(estimate)}.")
        findings.append(Finding("not_in_place", int(per), site, seen,
                                IN_PLACE_FIXES.get(func, "do it in place"), int(estimate)))
    return findings


def check_pageable_copies(run):
    """Host-to-device copies from pageable memory or blocking: a speed tip,
    with the bytes copied per step."""
    steps = _steps_for_average(run)
    wanted = {s.index for s in steps}
    copies = [c for c in run.observation.copies
              if run.step_of(c.event) in wanted and not (c.pinned and c.non_blocking)]
    if not copies:
        return []
    n = max(len(steps), 1)
    by_site = collections.defaultdict(list)
    for c in copies:
        by_site[c.site].append(c)
    findings = []
    for site, items in by_site.items():
        per = sum(c.bytes for c in items) / n
        share = lambda k: "all" if k == len(items) else f"{k} of {len(items)}"  # noqa: E731
        pageable = sum(not c.pinned for c in items)
        blocking = sum(not c.non_blocking for c in items)
        how = []
        if pageable:
            how.append(f"{share(pageable)} from pageable (unpinned) memory")
        if blocking:
            how.append(f"{share(blocking)} with non_blocking=False")
        seen = (f"{len(items) / n:g} copies per step to {items[0].destination} at {site} "
                f"({_fmt(per)} per step), " + " and ".join(how) + ": the loop waits for "
                "each copy instead of overlapping it with compute.")
        fix = ("pin the source (DataLoader(pin_memory=True) or x.pin_memory()) and copy "
               "with x.to(device, non_blocking=True)")
        findings.append(Finding("pageable_copy", int(per), site, seen, fix, 0))
    return findings


# -- a KV cache in training ---------------------------------------------------


def check_kv_cache(run):
    """A forward in training (train mode, grad enabled) whose output carries
    a KV cache: an HF model with use_cache=True (its config's default) keeps
    every layer's keys and values alive with the output, after backward
    freed what autograd saved, and under checkpointing, which would not
    keep them at all. Reported where dropping them at the end of the
    forward's step lowers the steps' peak by MIN_SHARE of the memory in
    use (they are saved for backward anyway until then)."""
    by_site = collections.defaultdict(list)
    for f in run.observation.forwards:
        if f.kv_cache_bytes and f.training and f.grad_enabled:
            by_site[f.site].append(f)
    steps = _steps_for_average(run)
    if not steps:
        return []
    peak = max(s.peak for s in steps)
    findings = []
    for site, forwards in by_site.items():
        intervals = []
        for f in forwards:
            k = run.step_of(f.first_event)
            start = run.steps[k].end_event if 0 <= k < len(run.steps) else f.end_event
            intervals += [(start, _end_of(run, a), a.bytes) for a in
                          (run.allocations.get(i) for i in f.kv_cache_ids) if a is not None]
        saving = peak - max(_peak_without(run, s, intervals) for s in steps)
        if not _worth(saving, peak, run):
            continue
        per = max(f.kv_cache_bytes for f in forwards)
        n = len(forwards)
        seen = (f"the forward at {site} returns a KV cache (past_key_values) of {_fmt(per)} "
                f"in {n} training forward{'s' if n > 1 else ''}: every "
                "layer's keys and values, alive with the output after backward (and kept "
                "under activation checkpointing, which would drop them); dropped once "
                f"backward ran, the steps' peak falls by {_fmt(saving)}.")
        fix = ("turn the cache off for training: `model.config.use_cache = False`, or pass "
               "`use_cache=False` to the forward")
        findings.append(Finding("kv_cache", int(per), site, seen, fix, int(saving)))
    return findings
