"""estimate: the peak at a large batch predicted by memfit (probes at
batches 4, 8, 16 of an example batch; meta mode at the batch itself), by
MemTracker under FakeTensorMode and by accelerate's estimate (the "Training
using Adam" column of `accelerate estimate-memory`: weights only), each
against the measured peak (torch.profiler) of that step."""

import statistics
import time

import memfit
from peers.common import (adam, clean, err_cell, first_line, fmt_bytes, md_table,
                          plain_iterations, profiler_peak, run_cases)

__all__ = ["HEADING", "run", "report"]

HEADING = "estimate: the peak at a large batch, predicted vs measured"

ESTIMATE_QUICK = [("mlp", 2048), ("cnn", 256), ("gpt", 256), ("lstm", 512),
                  ("hf-gpt2", 32), ("hf-bert", 32), ("hf-llama", 32)]
ESTIMATE_FULL = [("mlp", 8192), ("cnn", 1024), ("gpt", 1024), ("lstm", 2048),
                 ("hf-gpt2", 128), ("hf-bert", 128), ("hf-llama", 128)]
PROBE_EXAMPLE = 16     # memfit probes b/4, b/2, b of this example batch


def memtracker_fake(spec, batch):
    """MemTracker under FakeTensorMode: model, Adam and batch are fake."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    with FakeTensorMode():
        model = spec.model()
        opt = adam(model)
        xh, yh = spec.sample_x(batch), spec.sample_y(batch)
        mt = MemTracker()
        mt.track_external(model, opt)
        with mt:
            plain_iterations(spec, model, xh, yh, opt=opt, after_first=mt.reset_mod_stats)
    snap = mt.get_tracker_snapshot("peak")
    dev = next(iter(snap))
    return snap[dev]["Total"]


def accelerate_estimate(model):
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes

    total, _largest = calculate_maximum_sizes(model)
    usage = estimate_training_usage(total, "float32")
    return max(usage.values()), total  # the command prints the max as "Training using Adam"


def _measure(r, key, estimate):
    """r.update(estimate()) timed as r[key + "_seconds"]; an exception is the
    result r[key + "_error"] (a peer raising is a result)."""
    t0 = time.perf_counter()
    try:
        r.update(estimate())
    except Exception as e:  # noqa: BLE001
        r[key + "_error"] = first_line(e)
    r[key + "_seconds"] = time.perf_counter() - t0


def estimate_case(spec, batch):
    r = dict(model=spec.name, note=spec.note, batch=batch)
    model = spec.model()
    r["parameters"] = sum(p.numel() for p in model.parameters())
    xh, yh = spec.batch(batch)
    t0 = time.perf_counter()
    r["measured"] = profiler_peak(spec, model, xh, yh)
    r["measured_seconds"] = time.perf_counter() - t0
    clean()
    # memfit, probes: a profile at the example batch, its probes b/4, b/2, b.
    xs, ys = spec.batch(PROBE_EXAMPLE)

    def probes():
        rep = memfit.profile(model, xs, ys, loss_fn=spec.loss_fn, optimizer="adam")
        return dict(memfit_probes=rep.predict_peak_bytes(batch))

    def meta():  # memfit, meta mode at the batch itself
        rep = memfit.profile(model, xh, yh, loss_fn=spec.loss_fn, optimizer="adam", mode="meta")
        return dict(memfit_meta=rep.peak_bytes, memfit_meta_mode=rep.mode,
                    memfit_meta_notes=list(rep.notes))

    def accelerate():
        total, model_bytes = accelerate_estimate(model)
        return dict(accelerate=total, accelerate_model_bytes=model_bytes)

    _measure(r, "memfit_probes", probes)
    clean()
    _measure(r, "memfit_meta", meta)
    clean()
    _measure(r, "memtracker_fake", lambda: dict(memtracker_fake=memtracker_fake(spec, batch)))
    _measure(r, "accelerate", accelerate)
    return r


def run(quick, pick, specs):
    return run_cases("estimate", pick(ESTIMATE_QUICK if quick else ESTIMATE_FULL), specs,
                     estimate_case, missing="model unavailable (transformers?)")


def estimate_table(cases):
    methods = [("memfit_probes", "memfit probes 4,8,16"), ("memfit_meta", "memfit meta"),
               ("memtracker_fake", "MemTracker + FakeTensorMode"),
               ("accelerate", "accelerate estimate (Adam)")]
    head = ["model", "batch", "measured peak"] + [f"{label}" for _, label in methods]
    rows, times = [], []
    errs = {k: [] for k, _ in methods}
    for c in cases:
        if c.get("error"):
            rows.append([c["model"], c["batch"], c["error"]] + ["-"] * len(methods))
            continue
        m = c["measured"]
        row = [f"{c['model']} ({c['parameters'] / 1e6:.2f}M params)", c["batch"], fmt_bytes(m)]
        trow = [c["model"], f"{c['measured_seconds']:.2f}"]
        for k, _ in methods:
            if k in c:
                e = c[k] / m - 1
                cell = f"{fmt_bytes(c[k])} ({err_cell(c[k], m)})"
                if k == "memfit_meta" and c.get("memfit_meta_mode") != "meta":
                    # Fell back to running the step for real: a measurement,
                    # not an estimate; left out of the means.
                    cell += f" [fell back to {c.get('memfit_meta_mode')}: not an estimate]"
                else:
                    errs[k].append(abs(e))
                row.append(cell)
            else:
                row.append(f"raises {c.get(k + '_error', '?')}")
            trow.append(f"{c.get(k + '_seconds', 0):.2f}")
        rows.append(row)
        times.append(trow)
    srow = ["**mean abs. error**", "", ""] + [
        f"{statistics.mean(v) * 100:.2f}% ({len(v)} models)" if v else "-" for k, v in errs.items()]
    rows.append(srow)
    srow = ["**max abs. error**", "", ""] + [
        f"{max(v) * 100:.2f}%" if v else "-" for k, v in errs.items()]
    rows.append(srow)
    t = md_table(head, rows)
    t2 = md_table(["model", "measured step s"] + [f"{label} s" for _, label in methods], times)
    notes = []
    for c in cases:
        for n in c.get("memfit_meta_notes", []) or []:
            notes.append(f"- {c['model']}: memfit meta note: {n}")
    return t + "\n\nWall time of each estimate (seconds):\n\n" + t2 + (
        "\n\n" + "\n".join(notes) if notes else "")




report = estimate_table
