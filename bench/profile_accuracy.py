"""How well memfit predicts a training step's peak from small probes, and what
profiling costs.

For each model, the peak predicted at batch B from probes at small batches
(each phase fitted as M0 + m*b) is compared with the peak measured by
profiling the step at B itself (both: memfit's tracking allocator on CPU, two
iterations, Adam). Built-in models go through the CLI
(`memfit profile --predict` and `memfit profile`); torchvision's resnet18 and
mobilenet_v2 (3x64x64 images, 10 classes, no weights) through memfit.profile.

Cost: wall time of memfit.profile(iterations=1) over one plain training step
(forward, loss, backward, Adam step, zero_grad) of the same nn.Module at the
same batch, in the same process, median of a few interleaved repeats. The
built-ins are timed through their Python twins (bench/_models.py).

    PYTHONPATH=build/python .venv/bin/python bench/profile_accuracy.py [--quick] [--json [PATH]]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from memfit.testing import models as _models  # noqa: E402

# model -> (batch, probes, cost batch). Batches are 256 where two CPU cores
# (generic BLAS, one thread) run the step fast enough; gpt (4 layers, width
# 256, context 128: ~1.6 s per sample for two iterations here) and the cost
# timings of the slow models use smaller ones. Probes: None = memfit's default
# 4,8,16.
FULL = {
    "mlp": (256, None, 256),
    "cnn": (256, None, 256),
    "gpt": (32, None, 2),
    "lstm": (256, None, 32),
    "resnet18": (256, None, 64),
    "mobilenet_v2": (256, None, 64),
}
QUICK = {
    "mlp": (256, None, 256),
    "cnn": (64, None, 64),
    # Not batch 1: there gpt's backward peaks at another moment, off the
    # line the larger batches lie on.
    "gpt": (8, [2, 3, 4], 1),
    "lstm": (64, None, 16),
    "resnet18": (64, None, 16),
    "mobilenet_v2": (64, None, 16),
}
BUILTIN = ("mlp", "cnn", "gpt", "lstm")
DEFAULT_PROBES = [4, 8, 16]
OPTIMIZER = "adam"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def cli_json(memfit_bin, args):
    cmd = [memfit_bin, "profile"] + args + ["--json"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()}")
    return json.loads(done.stdout)


def accuracy_cli(memfit_bin, name, batch, probes):
    """(predicted, measured, details) through the CLI."""
    base = ["--model", name, "--batch", str(batch), "--optimizer", OPTIMIZER]
    t0 = time.perf_counter()
    extra = ["--probes", ",".join(map(str, probes))] if probes else []
    pred = cli_json(memfit_bin, base + ["--predict"] + extra)
    t1 = time.perf_counter()
    meas = cli_json(memfit_bin, base)
    t2 = time.perf_counter()
    return dict(
        predicted_peak_bytes=pred["predicted_peak_bytes"],
        measured_peak_bytes=meas["peak_bytes"],
        predicted_phase=f"{pred['peak_phase']}#{pred['peak_iteration']}",
        measured_phase=_measured_phase(meas),
        probes=pred["probe_batches"],
        max_rel_residual=pred["max_rel_residual"],
        notes=pred.get("notes", []) + meas.get("notes", []),
        predict_seconds=t1 - t0,
        measure_seconds=t2 - t1,
    )


def _measured_phase(report_json):
    peak = report_json["peak_bytes"]
    for p in report_json["phases"]:
        if p["peak_bytes"] == peak:
            return f"{p['name']}#{p['iteration']}"
    return "?"


def accuracy_python(memfit, name, batch, probes):
    """(predicted, measured, details) through memfit.profile: the prediction
    of a profile at the largest first probe batch, report.prediction(batch):
    probes from b/4, b/2, b grown toward the batch (Note [Probing toward the
    answer]), the same path the HTML page's curve and find_batch_size take."""
    probes = probes or DEFAULT_PROBES
    small = max(probes)
    model, x, y, loss_fn = _models.make(name, batch)
    t0 = time.perf_counter()
    xs, ys = x[:small].clone(), y[:small].clone()
    report_small = memfit.profile(model, xs, target=ys, loss_fn=loss_fn, optimizer=OPTIMIZER)
    sure = report_small.prediction(batch)
    pm = report_small.peak_model(batch)  # the model prediction() fitted
    predicted = sure.predicted_bytes
    phase = pm.peak_phase(batch)
    t1 = time.perf_counter()
    report = memfit.profile(model, x, target=y, loss_fn=loss_fn, optimizer=OPTIMIZER)
    t2 = time.perf_counter()
    return dict(
        predicted_peak_bytes=predicted,
        measured_peak_bytes=report.peak_bytes,
        predicted_phase=_phase_name(phase),
        measured_phase=f"{report.peak_phase}#{report._native.peak_iteration}",
        probes=list(sure.probes),
        max_rel_residual=pm.max_rel_residual(),
        held_out_error=sure.held_out_error,
        # PeakModel.notes is not bound in every build of the module.
        notes=list(getattr(pm, "notes", [])) + list(report.notes),
        predict_seconds=t1 - t0,
        measure_seconds=t2 - t1,
    )


def _phase_name(phase):
    name, iteration = phase  # PeakModel.peak_phase gives (phase, iteration)
    return f"{name}#{iteration}"


def plain_step(model, x, y, loss_fn, opt):
    # memfit's order: Note [The order of a training iteration] (report.h).
    out = model(x)
    loss = _models.loss_of(out, y, loss_fn)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def cost_ratio(memfit, name, batch, repeats):
    """Median wall time of memfit.profile(iterations=1) / median of one plain
    step, interleaved so that load on the machine hits both alike."""
    model, x, y, loss_fn = _models.make(name, batch)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    plain_step(model, x, y, loss_fn, opt)  # warm-up: Adam state, allocator
    plain, prof = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        plain_step(model, x, y, loss_fn, opt)
        t1 = time.perf_counter()
        memfit.profile(model, x, target=y, loss_fn=loss_fn, optimizer=OPTIMIZER, iterations=1)
        t2 = time.perf_counter()
        plain.append(t1 - t0)
        prof.append(t2 - t1)
    p, q = statistics.median(plain), statistics.median(prof)
    return dict(cost_batch=batch, plain_step_seconds=p, profile_seconds=q, cost_ratio=q / p)


def fmt_bytes(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def table(rows):
    head = ["model", "via", "batch", "probes", "predicted", "measured", "error %",
            "peak (pred/meas)", "cost batch", "profile/step"]
    lines = []
    for r in rows:
        if "error" in r:
            lines.append([r["model"], r["via"], str(r["batch"]), "", "", "", "", r["error"], "", ""])
            continue
        ratio = r.get("cost_ratio")
        lines.append([
            r["model"], r["via"], str(r["batch"]), ",".join(map(str, r["probes"])),
            fmt_bytes(r["predicted_peak_bytes"]), fmt_bytes(r["measured_peak_bytes"]),
            f"{r['error_pct']:+.3f}",
            f"{r['predicted_phase']} / {r['measured_phase']}",
            str(r.get("cost_batch", "")),
            f"{ratio:.2f}x" if ratio is not None else r.get("cost_error", "-"),
        ])
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h)
              for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(l, widths)) for l in lines]
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get("MEMFIT_BUILD", "build"),
                    help="build folder holding the memfit CLI and python/ (default: build)")
    ap.add_argument("--quick", action="store_true", help="smaller batches, fewer repeats")
    ap.add_argument("--json", nargs="?", const="-", metavar="PATH",
                    help="JSON results: on stdout instead of the table, or into PATH")
    ap.add_argument("--models", help="comma-separated subset of " + ",".join(FULL))
    ap.add_argument("--repeats", type=int, help="timing repeats (default 3, 2 with --quick)")
    ap.add_argument("--no-cost", action="store_true", help="skip the cost timings")
    args = ap.parse_args(argv)

    build = os.path.abspath(args.build)
    py_dir = os.path.join(build, "python")
    if os.path.isdir(py_dir) and py_dir not in sys.path:
        sys.path.insert(0, py_dir)
    import memfit

    memfit_bin = os.path.join(build, "memfit")
    config = QUICK if args.quick else FULL
    names = args.models.split(",") if args.models else list(config)
    unknown = [n for n in names if n not in config]
    if unknown:
        ap.error(f"unknown model(s) {unknown}: choose from {list(config)}")
    repeats = args.repeats or (2 if args.quick else 3)

    start = time.perf_counter()
    rows = []
    for name in names:
        batch, probes, cost_batch = config[name]
        via = "cli" if name in BUILTIN else "python"
        row = dict(model=name, via=via, batch=batch)
        log(f"[profile_accuracy] {name} at batch {batch} via {via} ...")
        try:
            if via == "cli":
                if not os.access(memfit_bin, os.X_OK):
                    raise RuntimeError(f"no CLI at {memfit_bin}")
                row.update(accuracy_cli(memfit_bin, name, batch, probes))
            else:
                if not _models.available(name):
                    raise RuntimeError("torchvision is not importable")
                row.update(accuracy_python(memfit, name, batch, probes))
            row["error_pct"] = (100.0 * (row["predicted_peak_bytes"] - row["measured_peak_bytes"])
                                / row["measured_peak_bytes"])
        except Exception as e:  # one model's failure must not hide the others
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            log(f"[profile_accuracy]   failed: {row['error']}")
        if not args.no_cost and "error" not in row:
            try:
                row.update(cost_ratio(memfit, name, cost_batch, repeats))
            except Exception as e:
                row["cost_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        rows.append(row)
    wall = time.perf_counter() - start

    result = dict(
        bench="profile_accuracy",
        quick=args.quick,
        torch=torch.__version__,
        torch_threads=torch.get_num_threads(),
        optimizer=OPTIMIZER,
        iterations=2,
        wall_seconds=wall,
        rows=rows,
    )
    if args.json and args.json != "-":
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.json == "-":
        print(json.dumps(result, indent=2))
    else:
        print(f"memfit profile accuracy ({'quick' if args.quick else 'full'}; torch "
              f"{torch.__version__}, {torch.get_num_threads()} thread(s), {OPTIMIZER}, "
              f"2 iterations; predicted from probes, measured at the batch itself)")
        print(table(rows))
        print("error %: (predicted - measured) / measured. profile/step: wall time of "
              "memfit.profile(iterations=1) over one plain training step at the cost batch "
              f"(median of {repeats}; built-ins timed through their Python twins).")
        for r in rows:
            for n in r.get("notes", []):
                print(f"note ({r['model']}): {n}")
        print(f"wall time: {wall:.1f} s")
    failed = [r["model"] for r in rows if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
