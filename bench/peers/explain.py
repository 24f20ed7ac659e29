"""explain: memfit.profile against torch's MemTracker
(torch.distributed._tools.mem_tracker) on the same step: the peak, the
categories at the peak and the bytes per module, against the bytes measured
live by torch.profiler's CPU allocator events and by memfit.track; the wall
time of each over the plain step."""

import gc
import statistics
import time

import memfit
from peers.common import (adam, clean, err_cell, fmt_bytes, md_table, model_state_bytes,
                          plain_iterations, profiler_peak, run_cases)

__all__ = ["HEADING", "run", "report"]

HEADING = "explain: memfit.profile vs torch's MemTracker on one step"

EXPLAIN_QUICK = [("mlp", 256), ("cnn", 64), ("gpt", 32)]
EXPLAIN_FULL = [("mlp", 512), ("cnn", 128), ("gpt", 64), ("lstm", 256), ("hf-gpt2", 16)]
EXPLAIN_REPEATS = 3


def track_peak(spec, model, xh, yh):
    model.zero_grad(set_to_none=True)
    clean()
    with memfit.track() as t:
        plain_iterations(spec, model, xh, yh)
    return model_state_bytes(model) + t.peak_bytes


_MT_CATEGORY = {"Parameter": "parameter", "Buffer": "buffer", "Gradient": "gradient",
                "Activation": "activation", "Temp": "temporary", "Optstate": "optimizer_state",
                "Other": "other"}


def memtracker_eager(spec, model, xh, yh):
    from torch.distributed._tools.mem_tracker import MemTracker, _ModState

    model.zero_grad(set_to_none=True)
    mt = MemTracker()
    mt.track_external(model)
    opt = None
    with mt:
        opt = adam(model)
        plain_iterations(spec, model, xh, yh, opt=opt, after_first=mt.reset_mod_stats)
    snap = mt.get_tracker_snapshot("peak")
    dev = next(iter(snap)) if snap else None
    cats = {}
    total = None
    if dev is not None:
        for k, v in snap[dev].items():
            key = getattr(k, "value", k)
            if key == "Total":
                total = v
            else:
                cats[_MT_CATEGORY.get(key, key)] = v
    modules = {}
    for stats in mt.memory_tracking.values():
        name = stats.mod_fqn
        snaps = stats.snapshots
        try:
            pre = snaps[_ModState.PRE_FW][-1][dev]["Total"]
            post = snaps[_ModState.POST_FW][-1][dev]["Total"]
            peak_fw = snaps[_ModState.PEAK_FW][-1][dev]["Total"]
            modules[name] = dict(forward_retained=post - pre, forward_peak_above=peak_fw - pre)
        except (KeyError, IndexError, TypeError):
            continue
    del opt
    return dict(peak=total, categories=cats, modules=modules)


def explain_case(spec, batch):
    model = spec.model()
    xh, yh = spec.batch(batch)
    measured = profiler_peak(spec, model, xh, yh)
    tracked = track_peak(spec, model, xh, yh)
    clean()
    report = memfit.profile(model, xh, yh, loss_fn=spec.loss_fn, optimizer="adam")
    mt = memtracker_eager(spec, model, xh, yh)
    clean()
    # Wall times, interleaved: plain, memfit.profile, MemTracker.
    plain_t, prof_t, mt_t = [], [], []
    for _ in range(EXPLAIN_REPEATS):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        plain_iterations(spec, model, xh, yh)
        t1 = time.perf_counter()
        memfit.profile(model, xh, yh, loss_fn=spec.loss_fn, optimizer="adam")
        t2 = time.perf_counter()
        memtracker_eager(spec, model, xh, yh)
        t3 = time.perf_counter()
        plain_t.append(t1 - t0)
        prof_t.append(t2 - t1)
        mt_t.append(t3 - t2)
        gc.collect()
    p = statistics.median(plain_t)
    mf_modules = {name: b for name, b in report.modules}
    return dict(
        model=spec.name, batch=batch, measured=measured, tracked=tracked,
        memfit=dict(peak=report.peak_bytes, phase=f"{report.peak_phase}#{report.peak_iteration}",
                    categories=dict(report.categories_at_peak), modules=mf_modules,
                    overhead=statistics.median(prof_t) / p),
        memtracker=dict(peak=mt["peak"], categories=mt["categories"], modules=mt["modules"],
                        overhead=statistics.median(mt_t) / p),
        plain_seconds=p,
    )


def run(quick, pick, specs):
    return run_cases("explain", pick(EXPLAIN_QUICK if quick else EXPLAIN_FULL), specs,
                     explain_case)


def explain_tables(cases):
    parts = []
    head = ["model", "batch", "measured peak (torch.profiler)", "memfit.track", "memfit.profile",
            "error", "MemTracker", "error", "profile time / step", "MemTracker time / step"]
    rows = []
    for c in cases:
        if c.get("error"):
            rows.append([c["model"], c["batch"], c["error"]] + ["-"] * 7)
            continue
        m = c["measured"]
        rows.append([
            c["model"], c["batch"], fmt_bytes(m), fmt_bytes(c["tracked"]),
            fmt_bytes(c["memfit"]["peak"]), err_cell(c["memfit"]["peak"], m),
            fmt_bytes(c["memtracker"]["peak"]), err_cell(c["memtracker"]["peak"], m),
            f"{c['memfit']['overhead']:.2f}x", f"{c['memtracker']['overhead']:.2f}x",
        ])
    parts.append(md_table(head, rows))
    cats = ["parameter", "buffer", "input", "activation", "gradient", "optimizer_state",
            "temporary", "other"]
    for c in cases:
        if c.get("error"):
            continue
        mf, mt = c["memfit"]["categories"], c["memtracker"]["categories"]
        rows = [[k, fmt_bytes(mf.get(k, 0)), fmt_bytes(mt.get(k)) if k in mt else "(no such category)"]
                for k in cats]
        rows.append(["**total**", fmt_bytes(c["memfit"]["peak"]), fmt_bytes(c["memtracker"]["peak"])])
        parts.append(f"Categories at the peak, {c['model']} batch {c['batch']} "
                     f"(memfit's peak in {c['memfit']['phase']}):\n\n"
                     + md_table(["category", "memfit.profile", "MemTracker"], rows))
        mods = c["memfit"]["modules"]
        mtm = c["memtracker"]["modules"]
        root = next((k for k in mtm if "." not in k), None)

        def mt_lookup(name):
            key = name if name == "(top level)" else (f"{root}.{name}" if root else name)
            if name == "(top level)":
                key = root
            return mtm.get(key)

        names = sorted(mods, key=lambda k: -mods[k])[:6]
        extra = [k.split(".", 1)[1] for k in sorted(mtm, key=lambda k: -mtm[k]["forward_retained"])
                 if "." in k][:6]
        for n in extra:
            if n not in names:
                names.append(n)
        rows = []
        for n in names[:10]:
            e = mt_lookup(n)
            rows.append([n, fmt_bytes(mods.get(n)) if n in mods else "-",
                         fmt_bytes(e["forward_retained"]) if e else "-",
                         fmt_bytes(e["forward_peak_above"]) if e else "-"])
        parts.append(f"Per module, {c['model']} batch {c['batch']}:\n\n" + md_table(
            ["module", "memfit: activations saved for backward",
             "MemTracker: bytes its forward left alive (post-fw minus pre-fw)",
             "MemTracker: forward peak above pre-fw"], rows))
    return "\n\n".join(parts)


report = explain_tables
