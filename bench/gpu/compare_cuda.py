"""memfit's predicted CUDA peaks, made on the CPU, against the real GPU's.

For each model and batch: memfit.profile(..., target_device="cuda") runs two
training iterations on the CPU and replays them through its model of the
CUDA caching allocator (predicted peak allocated and reserved); then the same
two iterations run on the GPU, each (model, batch) in a fresh process, and
torch.cuda.max_memory_allocated() / max_memory_reserved() are read. The CUDA
context (hundreds of MiB, outside the allocator) is in neither number.

The optimizer is Adam(lr=1e-3, foreach=True) on both sides: torch's default
for CUDA parameters is the multi-tensor ("foreach") implementation, whose
temporaries differ from the per-parameter one the CPU would pick.

    scripts/gpu_check.sh                          # builds memfit, then runs this
    python3 bench/gpu/compare_cuda.py --build build-gpu [--quick]
    python3 bench/gpu/compare_cuda.py --dry-run --quick   # predictions only, no GPU

Without the memfit Python module the built-in models (mlp, cnn, gpt, lstm)
are predicted through the CLI (`memfit profile --target cuda`), whose Adam is
LibTorch's per-parameter one (so the GPU side then uses foreach=False).
Without either, only the GPU measurements are made and saved.
Results: a table on stdout; JSON in --json PATH, or $OUT/gpu_compare.json.
"""

import argparse
import json
import os
import importlib.util
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)

import torch  # noqa: E402

from _tables import fmt_bytes  # noqa: E402

# The models by file, not through `import memfit`: this script also runs
# where memfit's extension does not import (it then predicts with the CLI).
_spec = importlib.util.spec_from_file_location(
    "memfit_testing_models", os.path.join(ROOT, "python", "memfit", "testing", "models.py"))
_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_models)

FULL = {
    "mlp": [64, 1024],
    "cnn": [64, 256],
    "gpt": [8, 32],
    "lstm": [32, 128],
    "resnet18": [32, 128],
    "mobilenet_v2": [32, 128],
}
QUICK = {"mlp": [64], "cnn": [32], "gpt": [4], "lstm": [16], "resnet18": [16]}
BUILTIN = ("mlp", "cnn", "gpt", "lstm")
ITERATIONS = 2
MEASURE_TIMEOUT_S = 120

# cuBLAS workspace per handle and stream, allocated through the caching
# allocator on the first matmul: 32 MiB on sm_90 (Hopper), else 8 MiB +
# 128 KiB (ATen/cuda/CublasHandlePool.cpp), unless CUBLAS_WORKSPACE_CONFIG.
HOPPER_WORKSPACE = 32 << 20
OTHER_WORKSPACE = (8 << 20) + (128 << 10)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# cuBLASLt's workspace beside the forward's: 1 MiB, in a 2 MiB segment.
LT_WORKSPACE_RESERVED = 2 << 20


def cublas_workspace(capability):
    """The workspace bytes torch will hold on a device of `capability`
    (None: unknown, assume the Hopper machines this script is for): one
    cuBLAS workspace for the forward's thread, one for autograd's backward
    thread, and cuBLASLt's (Note [cuBLAS workspaces on the card])."""
    per_handle = OTHER_WORKSPACE
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    sizes = re.findall(r":([0-9]+):([0-9]+)", config) if config else []
    if sizes:
        per_handle = sum(int(size) * 1024 * int(count) for size, count in sizes)
    elif capability is None or capability[0] == 9:
        per_handle = HOPPER_WORKSPACE
    return 2 * per_handle + LT_WORKSPACE_RESERVED


def make_adam(params, foreach):
    try:
        return torch.optim.Adam(params, lr=1e-3, foreach=foreach)
    except TypeError:  # a torch without the argument
        return torch.optim.Adam(params, lr=1e-3)


# ---------------------------------------------------------------- predict


def predict_python(memfit, name, batch, workspace, foreach):
    model, x, y, loss_fn = _models.make(name, batch)
    opt = make_adam(model.parameters(), foreach)
    report = memfit.profile(model, x, target=y, loss_fn=loss_fn, optimizer=opt,
                            iterations=ITERATIONS, target_device="cuda",
                            cuda_workspace=workspace)
    data = json.loads(report.to_json())
    return dict(
        cpu_peak_bytes=data["peak_bytes"],
        cpu_peak_phase=f"{report.peak_phase}#{report._native.peak_iteration}",
        predicted_allocated_bytes=data["cuda"]["peak_allocated_bytes"],
        predicted_reserved_bytes=data["cuda"]["peak_reserved_bytes"],
        workspace_bytes=data["cuda"].get("workspace_bytes", workspace),
        predicted_phases=[(p["name"], p["iteration"], p["peak_bytes"]) for p in data["phases"]],
    )


def predict_cli(memfit_bin, name, batch, workspace):
    cmd = [memfit_bin, "profile", "--model", name, "--batch", str(batch),
           "--optimizer", "adam", "--iterations", str(ITERATIONS), "--target", "cuda",
           "--cuda-workspace", str(workspace), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[:300]}")
    data = json.loads(done.stdout)
    peak = data["peak_bytes"]
    phase = next((f"{p['name']}#{p['iteration']}" for p in data["phases"]
                  if p["peak_bytes"] == peak), "?")
    return dict(
        cpu_peak_bytes=peak,
        cpu_peak_phase=phase,
        predicted_allocated_bytes=data["cuda"]["peak_allocated_bytes"],
        predicted_reserved_bytes=data["cuda"]["peak_reserved_bytes"],
        workspace_bytes=data["cuda"].get("workspace_bytes", workspace),
        predicted_phases=[(p["name"], p["iteration"], p["peak_bytes"]) for p in data["phases"]],
    )


# ---------------------------------------------------------------- measure


# memfit's order (Note [The order of a training iteration] in report.h); the
# order of the prediction's own phases is used where there is one.
DEFAULT_ORDER = ["inputs", "forward", "loss", "backward", "optimizer_step", "zero_grad"]


def phase_order(phases):
    """The phase names of iteration 1 (after "parameters"), from a report's
    [(name, iteration, peak)] rows."""
    order = [name for name, iteration, _ in phases if iteration == 1 and name != "parameters"]
    return order if set(order) == set(DEFAULT_ORDER) else DEFAULT_ORDER


def measure_here(name, batch, foreach, order=DEFAULT_ORDER, device="cuda"):
    """The step memfit.profile runs, phase by phase in memfit's order, on the
    GPU; peaks overall and per phase. Runs in a fresh process (see measure):
    nothing is cached yet."""
    dev = torch.device(device)
    torch.cuda.init()
    model, x, y, loss_fn = _models.make(name, batch)  # on the CPU, as memfit's
    torch.cuda.synchronize()
    base_allocated = torch.cuda.memory_allocated()
    base_reserved = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    phases = []

    def phase(label, iteration, fn):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        result = fn()
        torch.cuda.synchronize()
        phases.append(dict(name=label, iteration=iteration,
                           peak_allocated_bytes=torch.cuda.max_memory_allocated(),
                           peak_reserved_bytes=torch.cuda.max_memory_reserved(),
                           allocated_after_bytes=torch.cuda.memory_allocated()))
        return result

    phase("parameters", 1, lambda: model.to(dev))
    opt = make_adam(model.parameters(), foreach)
    live = {}
    steps = {
        "inputs": lambda: live.update(x=x.to(dev), y=y.to(dev)),
        "forward": lambda: live.update(out=model(live["x"])),
        "loss": lambda: live.update(loss=_models.loss_of(live["out"], live["y"], loss_fn)),
        "backward": lambda: live["loss"].backward(),
        "optimizer_step": lambda: opt.step(),
        "zero_grad": lambda: opt.zero_grad(set_to_none=True),
    }
    for it in range(1, ITERATIONS + 1):
        for name_ in order:
            phase(name_, it, steps[name_])
        live.clear()  # as memfit: the batch, output and loss die here
    peak = max(phases, key=lambda p: p["peak_allocated_bytes"])
    result = dict(
        measured_allocated_bytes=max(p["peak_allocated_bytes"] for p in phases) - base_allocated,
        measured_reserved_bytes=max(p["peak_reserved_bytes"] for p in phases) - base_reserved,
        measured_peak_phase=f"{peak['name']}#{peak['iteration']}",
        measured_phases=phases,
        base_allocated_bytes=base_allocated,
    )
    del model, opt
    import gc

    gc.collect()
    torch.cuda.synchronize()
    # What outlives the model and optimizer: the cuBLAS/cuBLASLt workspaces.
    result["persistent_after_bytes"] = torch.cuda.memory_allocated() - base_allocated
    result["num_alloc_retries"] = torch.cuda.memory_stats().get("num_alloc_retries", 0)
    return result


def measure(name, batch, foreach, order):
    cmd = [sys.executable, os.path.abspath(__file__), "--measure-one", name, str(batch),
           "--foreach", "1" if foreach else "0", "--order", ",".join(order)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=MEASURE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"measuring took over {MEASURE_TIMEOUT_S} s")
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:]
        raise RuntimeError(f"measuring exited {done.returncode}: {' | '.join(tail)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- report


def err(pred, meas):
    if pred is None or meas is None or meas == 0:
        return None
    return 100.0 * (pred - meas) / meas


def fmt_err(e):
    return "-" if e is None else f"{e:+.2f}"


def table(rows, dry_run):
    if dry_run:
        head = ["model", "batch", "via", "cpu peak", "pred alloc", "pred reserved", "peak phase"]
    else:
        head = ["model", "batch", "via", "pred alloc", "meas alloc", "err %",
                "pred reserved", "meas reserved", "err %", "peak phase (pred/meas)"]
    lines = []
    for r in rows:
        if "error" in r:
            lines.append([r["model"], str(r["batch"]), r.get("via", "-"), r["error"]])
            continue
        if dry_run:
            lines.append([r["model"], str(r["batch"]), r["via"], fmt_bytes(r.get("cpu_peak_bytes")),
                          fmt_bytes(r.get("predicted_allocated_bytes")),
                          fmt_bytes(r.get("predicted_reserved_bytes")), r.get("cpu_peak_phase", "-")])
        else:
            lines.append([
                r["model"], str(r["batch"]), r["via"],
                fmt_bytes(r.get("predicted_allocated_bytes")), fmt_bytes(r.get("measured_allocated_bytes")),
                fmt_err(r.get("allocated_error_pct")),
                fmt_bytes(r.get("predicted_reserved_bytes")), fmt_bytes(r.get("measured_reserved_bytes")),
                fmt_err(r.get("reserved_error_pct")),
                f"{r.get('cpu_peak_phase', '-')} / {r.get('measured_peak_phase', '-')}",
            ])
    widths = [max([len(h)] + [len(l[i]) for l in lines if i < len(l) and len(l) == len(head)])
              for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)),
           "  ".join("-" * w for w in widths)]
    for l in lines:
        out.append("  ".join(c.ljust(w) for c, w in zip(l, widths)) if len(l) == len(head)
                   else "  ".join(l))
    return "\n".join(out)


def device_info():
    info = dict(torch=torch.__version__, cuda_available=torch.cuda.is_available(),
                torch_cuda=getattr(torch.version, "cuda", None))
    if info["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, capability=list(torch.cuda.get_device_capability(0)),
                    total_memory_bytes=props.total_memory)
        try:
            info["cudnn"] = torch.backends.cudnn.version()
        except Exception:
            pass
    return info


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get("MEMFIT_BUILD", "build-gpu"),
                    help="memfit build folder (python/ and the CLI); default build-gpu")
    ap.add_argument("--quick", action="store_true", help="one small batch per model")
    ap.add_argument("--dry-run", action="store_true",
                    help="predictions only (CPU): no GPU needed")
    ap.add_argument("--models", help="comma-separated subset of " + ",".join(FULL))
    ap.add_argument("--workspace", type=int,
                    help="cuBLAS workspace bytes to predict with (default: from the GPU)")
    ap.add_argument("--via", choices=("auto", "python", "cli"), default="auto",
                    help="predict through the Python module or the CLI (default: the "
                         "module if it imports, else the CLI)")
    ap.add_argument("--json", help="write results here (default $OUT/gpu_compare.json if OUT is set)")
    ap.add_argument("--measure-one", nargs=2, metavar=("MODEL", "BATCH"), help=argparse.SUPPRESS)
    ap.add_argument("--foreach", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--order", default=",".join(DEFAULT_ORDER), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.measure_one:  # the child process of measure()
        name, batch = args.measure_one[0], int(args.measure_one[1])
        order = args.order.split(",")
        print(json.dumps(measure_here(name, batch, bool(args.foreach), order)))
        return 0

    start = time.perf_counter()
    info = device_info()
    print(f"torch {info['torch']} (CUDA {info['torch_cuda']}); "
          + (f"GPU {info['gpu']}, sm_{info['capability'][0]}{info['capability'][1]}, "
             f"{fmt_bytes(info['total_memory_bytes'])}" if info["cuda_available"] else "no GPU"))
    if not args.dry_run and not info["cuda_available"]:
        print("compare_cuda: no CUDA device; run with --dry-run for the predictions alone",
              file=sys.stderr)
        return 2

    capability = tuple(info["capability"]) if info["cuda_available"] else None
    workspace = args.workspace if args.workspace is not None else cublas_workspace(capability)

    # How to predict: the Python module, else the CLI (built-ins only), else not.
    build = os.path.abspath(args.build)
    if not os.path.isdir(build):  # relative to the repository, not the cwd
        build = os.path.join(ROOT, args.build)
    py_dir = os.path.join(build, "python")
    if os.path.isdir(py_dir) and py_dir not in sys.path:
        sys.path.insert(0, py_dir)
    memfit, why = None, "not asked for"
    if args.via != "cli":
        try:
            import memfit
        except Exception as e:  # ImportError, or an extension built for another torch
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            if args.via == "python":
                log(f"compare_cuda: cannot import memfit: {why}")
                return 2
    memfit_bin = os.path.join(build, "memfit")
    if memfit is not None:
        via = "python"
    elif os.access(memfit_bin, os.X_OK):
        via = "cli"
        log(f"compare_cuda: memfit Python module unavailable ({why}); "
            f"predicting the built-in models through {memfit_bin}")
    else:
        via = "none"
        log(f"compare_cuda: neither the memfit Python module ({why}) nor {memfit_bin}: "
            f"measuring only")
        if args.dry_run:
            return 2
    foreach = via != "cli"
    print(f"predictions via {via}; cuBLAS workspaces {fmt_bytes(workspace)}; "
          f"Adam(foreach={foreach}); {ITERATIONS} iterations; CUDA context not compared")

    config = QUICK if args.quick else FULL
    names = args.models.split(",") if args.models else list(config)
    unknown = [n for n in names if n not in FULL]
    if unknown:
        ap.error(f"unknown model(s) {unknown}: choose from {list(FULL)}")
    path = args.json or (os.path.join(os.environ["OUT"], "gpu_compare.json")
                         if os.environ.get("OUT") else None)
    result = dict(bench="compare_cuda", device=info, dry_run=args.dry_run, quick=args.quick,
                  via=via, workspace_bytes=workspace, optimizer=f"Adam(foreach={foreach})",
                  iterations=ITERATIONS, complete=False, rows=[])

    def save():
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                json.dump(result, f, indent=2)

    rows = result["rows"]
    for name in names:
        for batch in config.get(name, FULL[name][:1]):
            row = dict(model=name, batch=batch, via=via)
            rows.append(row)
            if not _models.available(name):
                row["error"] = "skipped: torchvision is not importable"
                continue
            if via == "cli" and name not in BUILTIN:
                row["error"] = "skipped: the CLI knows only the built-in models"
                continue
            log(f"[compare_cuda] {name} batch {batch} ...")
            try:
                t0 = time.perf_counter()
                if via == "python":
                    row.update(predict_python(memfit, name, batch, workspace, foreach))
                elif via == "cli":
                    row.update(predict_cli(memfit_bin, name, batch, workspace))
                row["predict_seconds"] = time.perf_counter() - t0
                if not args.dry_run:
                    t0 = time.perf_counter()
                    order = phase_order(row.get("predicted_phases", []))
                    row["phase_order"] = order
                    row.update(measure(name, batch, foreach, order))
                    row["measure_seconds"] = time.perf_counter() - t0
                    row["allocated_error_pct"] = err(row.get("predicted_allocated_bytes"),
                                                     row["measured_allocated_bytes"])
                    row["reserved_error_pct"] = err(row.get("predicted_reserved_bytes"),
                                                    row["measured_reserved_bytes"])
            except Exception as e:  # one failure must not hide the other rows
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                log(f"[compare_cuda]   failed: {row['error']}")
            save()  # what is done survives a timeout

    print(table(rows, args.dry_run))
    if not args.dry_run:
        persistent = sorted({r["persistent_after_bytes"] for r in rows if "persistent_after_bytes" in r})
        if persistent:
            print(f"left allocated after each run (workspaces): "
                  f"{', '.join(fmt_bytes(p) for p in persistent)}; memfit counts {fmt_bytes(workspace)}"
                  f" in allocated and reserved")
    print("err %: (predicted - measured) / measured; allocated/reserved exclude the CUDA context.")
    wall = time.perf_counter() - start
    print(f"wall time: {wall:.1f} s")

    result.update(complete=True, wall_seconds=wall)
    save()
    if path:
        print(f"results written to {path}")
    return 1 if any("error" in r and not r["error"].startswith("skipped") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
