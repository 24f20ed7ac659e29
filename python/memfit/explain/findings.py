"""What a snapshot's trace shows, in the doctor's words: what filled memory
at the peak, fragmentation, gradients alive through the next forward, the
optimizer's first step, what was alive at an out-of-memory error."""

from typing import List, Optional

from .._native import native as _memfit
from ..diagnosis.records import Finding
from .frames import describe, place_of
from .trace import TraceEvents

__all__: list = []

_FIX = {
    "activation": "activation checkpointing or a smaller micro-batch (memfit advise plans both)",
    "gradient": "free the gradients sooner (zero_grad(set_to_none=True) after step)",
    "optimizer_state": "a lighter optimizer state (8-bit or paged Adam, offload: memfit advise)",
    "temporary": "a smaller micro-batch, or a kernel of the op that makes them that keeps "
                 "less (SDPA's memory-efficient attention for attention's): memfit advise "
                 "measures both",
    "parameter": "lower precision weights or sharding (FSDP: memfit profile --world-size)",
    # See Note [Workspaces in a snapshot] (snapshot_events.cpp).
    "workspace": "cuBLAS keeps a workspace per thread and stream: "
                 "CUBLAS_WORKSPACE_CONFIG=:4096:2:16:8 makes Hopper's 32 MiB the 8 MiB + "
                 "128 KiB of older cards (:16:8: 128 KiB, slower matmuls); the rest of the "
                 "peak is what a smaller batch or memfit advise lowers",
}


def _fb(n):
    return _memfit.format_bytes(int(n))


def _top(pairs, total, limit=3, min_share=0.05):
    out = []
    for name, b in pairs[:limit]:
        if total and b / total >= min_share:
            out.append(f"{name or '(no Python frame)'} {_fb(b)} ({100 * b / total:.0f}%)")
    return ", ".join(out)


def _categories_text(cats: dict, total: int) -> str:
    pairs = sorted(((c, b) for c, b in cats.items() if b), key=lambda x: -x[1])
    return _top(pairs, total)


def _phase_at(events: TraceEvents, event_index: int):
    name, it = "other", 1
    for first, phase, iteration in events.spans:
        if first <= event_index:
            name, it = phase, iteration
    return name, it


# Temporaries by the phase that makes them: the loss's logits, the
# optimizer's foreach copies; elsewhere _FIX's.
_TEMPORARY_FIX = {
    "loss": "a chunked loss: the logits never whole (memfit.chunked_loss(model) for an HF "
            "causal LM, memfit.chunked_linear_cross_entropy in your own loss)",
    "optimizer_step": "the optimizer's foreach=False: one parameter's temporaries at a time",
}

# The find_batch_size call that sizes the user's own step for a card.
_FIT = ("memfit.find_batch_size(model, batch, budget={budget}, target_device='cuda') finds "
        "the batch that fits; memfit.advise(...) when even one sample does not")


def _peak(events, raw) -> Finding:
    tl = events.timeline
    peak = tl.peak()
    b = tl.breakdown_after(peak.event_index)
    phase, it = _phase_at(events, peak.event_index)
    cats = b["categories"]
    top_cat = max(cats, key=cats.get)
    seen = (f"{_fb(peak.bytes)} allocated at the peak, in {phase} of iteration {it}: "
            f"{_categories_text(cats, peak.bytes)}")
    places = _top(b["modules"], peak.bytes)
    if places:
        seen += f"; by place: {places}"
    where = b["modules"][0][0] if b["modules"] else phase
    fix = (_TEMPORARY_FIX.get(phase) if top_cat == "temporary" else None) or _FIX.get(top_cat)
    return Finding("peak", peak.bytes, where, seen,
                   fix or "memfit advise --budget SIZE plans around the largest")


def _fragmentation(events, raw, dump) -> Optional[Finding]:
    frag = dump  # computed by the caller: {"reserved", "allocated", "gap", ...}
    gap = frag["at_reserved_peak"]["gap_bytes"]
    reserved = frag["at_reserved_peak"]["reserved_bytes"]
    if reserved <= 0 or gap < max(64 << 20, reserved // 10):
        return None
    seen = (f"at the reserved peak {_fb(reserved)} was reserved and "
            f"{_fb(frag['at_reserved_peak']['allocated_bytes'])} allocated: {_fb(gap)} "
            f"({100 * gap / reserved:.0f}%) held in the cache, free but not used")
    d = frag["at_dump"]
    if d["reserved_bytes"]:
        seen += (f"; at the dump {_fb(d['free_bytes'])} of {_fb(d['reserved_bytes'])} was free, "
                 f"the largest free block {_fb(d['largest_free_block'])}")
    return Finding("fragmentation", gap, "", seen,
                   "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets segments grow "
                   "instead of caching many; or make the largest tensors first")


def _accumulating(spans, k):
    """Whether the forward spans[k] runs before any optimizer step since the
    last backward: gradient accumulation, whose gradients live through the
    next forward on purpose. A trace with no optimizer step seen cannot
    tell (an optimizer that allocates nothing): not taken for it."""
    if not any(phase == "optimizer_step" for _first, phase, _it in spans):
        return False
    for _first, phase, _it in reversed(spans[:k]):
        if phase == "optimizer_step":
            return False
        if phase == "backward":
            return True
    return False


def _grads_kept(events) -> Optional[Finding]:
    tl = events.timeline
    summaries = tl.phase_summaries()
    worst = None
    for k, (first, phase, it) in enumerate(events.spans):
        if phase != "forward" or it < 2 or k >= len(summaries):
            continue
        if _accumulating(events.spans, k):
            continue
        end = events.spans[k + 1][0] if k + 1 < len(events.spans) else len(tl)
        if end <= first:
            continue
        # live gradients at the forward's last event: they were made by the
        # previous backward and are still held.
        g = tl.breakdown_after(end - 1)["categories"]["gradient"]
        if g and (worst is None or g > worst[0]):
            worst = (g, it)
    if worst is None:
        return None
    g, it = worst
    return Finding(
        "grads_kept", g, f"forward of iteration {it}",
        f"{_fb(g)} of gradients from iteration {it - 1}'s backward were still alive at the end "
        f"of iteration {it}'s forward, beside its activations",
        "optimizer.zero_grad(set_to_none=True) right after optimizer.step(), not just before "
        "backward (unless gradients are accumulated on purpose)")


def _first_step(events) -> Optional[Finding]:
    tl = events.timeline
    spans = events.spans
    for k, (first, phase, it) in enumerate(spans):
        if phase != "optimizer_step":
            continue
        end = spans[k + 1][0] if k + 1 < len(spans) else len(tl)
        if end <= first:
            return None
        state = tl.breakdown_after(end - 1)["categories"]["optimizer_state"]
        if not state:
            return None
        peak = tl.peak()
        peak_phase, peak_it = _phase_at(events, peak.event_index)
        seen = (f"the optimizer's first step (iteration {it}) allocated {_fb(state)} of state "
                "that lives from then on: every later iteration runs that much higher")
        if peak_it > it:
            seen += f"; the peak is in iteration {peak_it} ({peak_phase}), after it"
        return Finding("optimizer_first_step", state, f"optimizer_step of iteration {it}", seen,
                       "size the budget on the second step, not the first (memfit profile "
                       "--iterations 2 measures it); a lighter state: memfit advise")
    return None


def _ooms(events, raw) -> List[Finding]:
    out = []
    tl = events.timeline
    for oom in events.ooms:
        frames = [raw.frames[i] for i in raw.stacks[oom.stack]]
        where = place_of(frames)
        alive = "nothing was allocated"
        live = 0
        if oom.events_before > 0:
            b = tl.breakdown_after(oom.events_before - 1)
            live = b["total"]
            alive = f"alive: {_categories_text(b['categories'], live)}"
            places = _top(b["modules"], live)
            if places:
                alive += f"; by place: {places}"
        phase, it = _phase_at(events, max(oom.events_before - 1, 0))
        seen = (f"asked for {_fb(oom.size)} in {phase} of iteration {it}"
                f"{' at ' + where if where else ''} with {_fb(live)} allocated and "
                f"{_fb(oom.reserved)} reserved; CUDA had {_fb(oom.device_free)} free")
        # The card had room for the request: a limit on the process refused it.
        capped = oom.device_free >= oom.size
        if capped:
            seen += (f", more than asked for: not the card but a cap on this process's memory "
                     f"refused it, at {_fb(oom.reserved)} reserved "
                     f"(torch.cuda.set_per_process_memory_fraction, or a limit the process runs "
                     f"under)")
        seen += f". {alive}"
        if not where:
            stack = describe(frames)
            if stack:
                seen += f" (frames: {'; '.join(stack)})"
        budget = f"'{_fb(oom.reserved).replace(' ', '')}'" if capped else "'SIZE'"
        fix = _FIT.format(budget=budget)
        if capped:
            fix = "raise the cap, or fit under it: " + fix
        out.append(Finding("oom", oom.size, where or phase, seen, fix))
    return out


def find(events: TraceEvents, raw, fragmentation: dict, replay=None) -> List[Finding]:
    """The findings of one device's trace, most important first: OOMs, the
    peak, then the rest by bytes."""
    found = _ooms(events, raw)
    if len(events.timeline):
        found.append(_peak(events, raw))
    rest = [f for f in (_fragmentation(events, raw, fragmentation), _grads_kept(events),
                        _first_step(events)) if f is not None]
    if events.pre_existing:
        rest.append(Finding("trace_incomplete", events.allocated_at_start, "",
                            events.notes[-1] if events.notes else "the trace is incomplete",
                            "call torch.cuda.memory._record_memory_history() before the "
                            "program's first CUDA allocation"))
    if replay is not None and replay.status == "checked" and not replay.matches:
        where = ""
        seen = replay.summary()
        if replay.first_off is not None:
            ti, m, r = replay.first_off
            sid = raw.traces[events.device].stack[ti]
            where = place_of([raw.frames[i] for i in raw.stacks[sid]])
            seen += (f"; first off at trace entry {ti}: {_fb(r)} replayed, {_fb(m)} on the card")
        rest.append(Finding("replay_differs", abs(replay.peak_reserved_replayed -
                                                  replay.peak_reserved_measured), where, seen,
                            "file it with this snapshot: memfit's CUDA estimates come from "
                            "this replay"))
    rest.sort(key=lambda f: -f.bytes)
    return found + rest
