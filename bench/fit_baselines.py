"""memfit's fit against the batch-size searches people use today: Lightning's
batch-size finder (power and binsearch) and accelerate's
find_executable_batch_size, on memfit's simulated device (CPU, a budget).

The baselines are written here from their documented algorithms
(shared/ANCHORS.md), not from their code:

- Lightning (Tuner.scale_batch_size / BatchSizeFinder, 2.6 defaults:
  init_val 2, steps_per_trial 3, max_trials 25, max_val 8192, margin 0.05).
  power: double while the trial fits; on the first OOM, the last size that
  worked. binsearch: double until the first OOM, then bisect between the last
  success and the failure until they differ by 1, then apply the margin:
  int(b * (1 - 0.05)). max_trials counts successful trials; a doubling is
  clamped to max_val and the search stops when the size no longer changes.
  The checkpoint save/restore around each trial is not simulated.
- accelerate (find_executable_batch_size, 1.15): start at 128; on an OOM
  retry the whole function at int(0.9 * bs); raise at 0.

A trial at batch b is real training on the simulated device:
`memfit train --model M --batch b --budget BUDGET --steps K --no-split
--coupled allow` (exit 0: fits, 2: out of memory). Lightning runs K=3 steps
per trial. accelerate re-runs the user's function, i.e. the training itself:
it is counted as 1 step per attempt; an attempt whose OOM comes at step 2 or 3
(Adam's state is created in step 1) counts the steps up to the OOM, since the
decorator would catch that one too. Its accepted batch must therefore pass 3
steps; its cost for that attempt is one real 1-step run.

memfit: `memfit fit --model M --budget BUDGET --json`, 0 trials at the budget;
its probes (batches 4, 8, 16, 2 iterations each: 6 steps, FitOptions::probes
and ProfileOptions::iterations) are its cost, reported as the fit's wall time.
Then one verification `train` (3 steps) at its max_batch: does it run?

The true maximum: the largest b whose 3-step `train` fits. Found by doubling
from 2 until the first OOM and bisecting to a gap of 1 (exhaustive given that
fitting is monotone in b), then confirmed by a linear scan around the
boundary (T-2, T-1 fit; T+1, T+2 do not; further if not).

Each distinct (model, budget, batch, steps) run happens once and its wall time
is recorded; a method's wall time is the sum over the runs it would make (each
one a fresh process, ~0.5 s of LibTorch start included: the JSON net_wall_ratio
subtracts the measured start of `memfit --help` from every run, memfit's too).
Ratios are baseline / memfit; no absolute claims.

    PYTHONPATH=build/python .venv/bin/python bench/fit_baselines.py [--quick] [--build build] [--json [PATH]]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

GPT_ARGS = ["--layers", "2", "--width", "128", "--context", "64"]
MODEL_ARGS = {"mlp": [], "cnn": [], "lstm": [], "gpt": GPT_ARGS}

# (model, budget). Budgets are chosen per model so that the exhaustive search
# and the baselines run in ~10 min (full) / ~2 min (quick) on two CPU cores:
# a step costs ~1.4 ms per sample for mlp, ~10 ms cnn, ~45 ms lstm and ~100 ms
# for this gpt here (one thread each, slower when the machine is shared), so
# mlp at 64 MiB (max ~5200) alone would take minutes.
FULL = [
    ("mlp", "16MiB"), ("mlp", "24MiB"),
    ("cnn", "64MiB"), ("cnn", "256MiB"),
    ("lstm", "32MiB"), ("lstm", "48MiB"),
    ("gpt", "32MiB"), ("gpt", "64MiB"),
]
QUICK = [("mlp", "14MiB"), ("cnn", "32MiB"), ("lstm", "24MiB"), ("gpt", "24MiB")]

LIGHTNING = dict(init_val=2, steps_per_trial=3, max_trials=25, max_val=8192, margin=0.05)
ACCEL_START = 128
TRUTH_STEPS = 3
MEMFIT_PROBE_STEPS = 6  # probes 4, 8, 16 x 2 iterations (FitOptions, ProfileOptions)
TRAIN_TIMEOUT = 600


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run_cli(cmd):
    """subprocess.run with a wait while the CLI is being relinked (other work
    in the tree rebuilds it): PermissionError / ETXTBSY / missing file are
    retried for up to two minutes. Returns (CompletedProcess, wall seconds)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            t0 = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=TRAIN_TIMEOUT)
            return done, time.perf_counter() - t0
        except OSError as e:
            if time.monotonic() > deadline:
                raise
            log(f"    {cmd[0]} not runnable ({e.strerror}); waiting for the build")
            time.sleep(5)


class Device:
    """Runs `memfit train` trials for one (model, budget), each distinct one
    once, and remembers outcome, the step it OOMed at, and wall time."""

    def __init__(self, memfit_bin, model, budget):
        self.bin, self.model, self.budget = memfit_bin, model, budget
        self.cache = {}
        self.runs = 0
        self.seconds = 0.0

    def train(self, batch, steps):
        key = (batch, steps)
        if key in self.cache:
            return self.cache[key]
        cmd = [self.bin, "train", "--model", self.model, "--batch", str(batch),
               "--budget", self.budget, "--steps", str(steps), "--no-split",
               "--coupled", "allow", "--json"] + MODEL_ARGS[self.model]
        done, wall = run_cli(cmd)
        if done.returncode not in (0, 2):
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[:300]}")
        fits = done.returncode == 0
        if fits:
            peaks = [s["peak_bytes"] for s in json.loads(done.stdout)["steps"]]
            steps_run = steps
        else:
            peaks = []
            m = re.search(r"out of memory at step (\d+)", done.stderr)
            steps_run = int(m.group(1)) if m else 0  # 0: the model alone does not fit
        r = dict(batch=batch, steps=steps, fits=fits, steps_run=steps_run,
                 seconds=wall, peaks=peaks)
        self.cache[key] = r
        self.runs += 1
        self.seconds += wall
        log(f"    train {self.model} b={batch} steps={steps}: "
            f"{'fits' if fits else f'OOM at step {steps_run}'} ({wall:.1f} s)")
        return r


class Tally:
    def __init__(self, method):
        self.method, self.trials, self.steps, self.ooms, self.seconds = method, 0, 0, 0, 0.0
        self.batches = []

    def add(self, run, steps=None):
        self.trials += 1
        self.steps += run["steps_run"] if steps is None else steps
        self.ooms += 0 if run["fits"] else 1
        self.seconds += run["seconds"]
        self.batches.append(run["batch"])

    def row(self, batch, **extra):
        return dict(method=self.method, batch=batch, trials=self.trials, steps=self.steps,
                    ooms=self.ooms, seconds=self.seconds, tried=self.batches, **extra)


def lightning(dev, mode):
    """Lightning's finder, power or binsearch, from its documented algorithm."""
    p = LIGHTNING
    t = Tally(f"lightning-{mode}")
    # Lightning's binsearch starts with low = 1: after a first trial that
    # fails it settles on 1 without trying it.
    size, low, high, successes = p["init_val"], (1 if mode == "binsearch" else 0), None, 0
    result = None
    while True:
        r = dev.train(size, p["steps_per_trial"])
        t.add(r)
        if r["fits"]:
            successes += 1
            low = size
            if successes > p["max_trials"]:
                result = size
                break
            if high is not None:  # bisecting (binsearch only)
                if high - low <= 1:
                    result = low
                    break
                size = (low + high) // 2
                continue
            nxt = min(size * 2, p["max_val"])
            if nxt == size:
                result = size
                break
            size = nxt
        else:
            if mode == "power":
                if low:
                    result = low
                    break
                if size == 1:
                    result = None  # nothing fits
                    break
                size = max(1, size // 2)
                continue
            high = size
            if high - low <= 1:
                result = low or None
                break
            size = (low + high) // 2
    pre_margin = result
    if mode == "binsearch" and result:
        result = max(1, int(result * (1 - p["margin"])))
    return t.row(result, pre_margin=pre_margin)


def accelerate(dev):
    """find_executable_batch_size: start at 128, int(0.9 * bs) after an OOM."""
    t = Tally("accelerate")
    bs = ACCEL_START
    while bs > 0:
        r = dev.train(bs, TRUTH_STEPS)  # the user's training: an OOM in any step restarts
        if r["fits"]:
            # The function goes on training; the search cost is its first step.
            t.add(dev.train(bs, 1), steps=1)
            return t.row(bs)
        t.add(r)
        bs = int(0.9 * bs)
    return t.row(None, error="raised: no executable batch size found")


def truth(dev):
    """Largest b whose 3-step train fits: doubling + bisection, then a linear
    confirmation scan around the boundary."""
    size, low, high = 2, 0, None
    while high is None:
        if dev.train(size, TRUTH_STEPS)["fits"]:
            low, size = size, size * 2
        else:
            high = size
    if low == 0 and not dev.train(1, TRUTH_STEPS)["fits"]:
        return dict(max_batch=0, monotone_checked=[])
    low = max(low, 1) if high > 1 else low
    while high - low > 1:
        mid = (low + high) // 2
        if dev.train(mid, TRUTH_STEPS)["fits"]:
            low = mid
        else:
            high = mid
    T = low
    # Linear scan: T-2, T-1 must fit; T+1, T+2 must not. A fit above T moves
    # the maximum up and the scan goes on past it.
    checked, monotone = [], True
    for b in [T - 2, T - 1]:
        if b >= 1:
            ok = dev.train(b, TRUTH_STEPS)["fits"]
            checked.append((b, ok))
            monotone &= ok
    b, misses = T + 1, 0
    while misses < 2:
        ok = dev.train(b, TRUTH_STEPS)["fits"]
        checked.append((b, ok))
        if ok:
            monotone, T, misses = False, b, 0
        else:
            misses += 1
        b += 1
    peaks = dev.train(T, TRUTH_STEPS)["peaks"]
    return dict(max_batch=T, monotone_near_boundary=monotone, checked=checked,
                step_peaks_at_max=peaks, steady_by_step3=len(peaks) >= 3 and peaks[1] == peaks[2])


def memfit_fit(dev, memfit_bin, model, budget):
    cmd = [memfit_bin, "fit", "--model", model, "--budget", budget, "--json"] + MODEL_ARGS[model]
    done, wall = run_cli(cmd)
    if done.returncode != 0:
        return dict(method="memfit", batch=None, trials=0, steps=MEMFIT_PROBE_STEPS, ooms=0,
                    seconds=wall, error=f"fit exited {done.returncode}: {done.stderr.strip()[:200]}")
    f = json.loads(done.stdout)
    log(f"    fit {model} {budget}: max_batch {f['max_batch']} ({wall:.1f} s)")
    v = dev.train(f["max_batch"], TRUTH_STEPS) if f["max_batch"] >= 1 else None
    return dict(method="memfit", batch=f["max_batch"], trials=0, steps=MEMFIT_PROBE_STEPS,
                ooms=0, seconds=wall, fit=f,
                recommended_batch=f.get("recommended_batch"),
                verify=None if v is None else dict(batch=v["batch"], fits=v["fits"],
                                                   steps_run=v["steps_run"], seconds=v["seconds"]))


def startup_seconds(memfit_bin, repeats=3):
    times = []
    for _ in range(repeats):
        times.append(run_cli([memfit_bin, "--help"])[1])
    return statistics.median(times)


def run_case(memfit_bin, model, budget, startup):
    dev = Device(memfit_bin, model, budget)
    t0 = time.perf_counter()
    mf = memfit_fit(dev, memfit_bin, model, budget)
    rows = [mf]
    rows.append(lightning(dev, "power"))
    rows.append(lightning(dev, "binsearch"))
    rows.append(accelerate(dev))
    tr = truth(dev)
    T = tr["max_batch"]
    base_s, base_net = mf["seconds"], max(mf["seconds"] - startup, 1e-9)
    for r in rows:
        b = r["batch"]
        r["found_over_true"] = (b / T) if (b and T) else None
        r["unsafe"] = bool(b and b > T)
        if r["method"] != "memfit":
            net = r["seconds"] - startup * r["trials"]
            r["wall_ratio"] = r["seconds"] / base_s
            r["net_wall_ratio"] = net / base_net
            r["steps_ratio"] = r["steps"] / MEMFIT_PROBE_STEPS
    return dict(model=model, budget=budget, true_max=T, truth=tr, rows=rows,
                distinct_runs=dev.runs, run_seconds=dev.seconds,
                case_seconds=time.perf_counter() - t0)


def fmt(x, spec, none="-"):
    return none if x is None else format(x, spec)


def table(cases):
    head = ["model", "budget", "true", "method", "batch", "found/true", "steps", "OOMs",
            "wall s", "wall x", "steps x", "note"]
    lines = []
    for c in cases:
        for r in c["rows"]:
            note = []
            if r.get("unsafe"):
                note.append("UNSAFE")
            if r["method"] == "memfit":
                v = r.get("verify")
                if v:
                    note.append(f"verify b={v['batch']}: {'ran' if v['fits'] else 'OOM'}")
                if r.get("recommended_batch") is not None:
                    note.append(f"rec. {r['recommended_batch']}")
            if r["method"] == "lightning-binsearch" and r.get("pre_margin"):
                note.append(f"pre-margin {r['pre_margin']}")
            if r["method"] == "lightning-power" and r["batch"] == LIGHTNING["max_val"]:
                note.append("hit max_val")
            if r.get("error"):
                note.append(r["error"])
            lines.append([
                c["model"], c["budget"], str(c["true_max"]), r["method"],
                fmt(r["batch"], "d"), fmt(r.get("found_over_true"), ".3f"),
                str(r["steps"]), str(r["ooms"]), f"{r['seconds']:.1f}",
                fmt(r.get("wall_ratio"), ".1f") if r["method"] != "memfit" else "1",
                fmt(r.get("steps_ratio"), ".1f") if r["method"] != "memfit" else "1",
                "; ".join(note),
            ])
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h)
              for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(l, widths)) for l in lines]
    return "\n".join(out)


def summary(cases):
    """Geometric means of the ratios per method, over the cases."""
    import math
    by = {}
    for c in cases:
        for r in c["rows"]:
            if r["method"] == "memfit" or r.get("wall_ratio") is None:
                continue
            d = by.setdefault(r["method"], dict(wall=[], net=[], steps=[], found=[], unsafe=0))
            d["wall"].append(r["wall_ratio"])
            d["net"].append(r["net_wall_ratio"])
            d["steps"].append(r["steps_ratio"])
            if r.get("found_over_true") is not None:
                d["found"].append(r["found_over_true"])
            d["unsafe"] += int(r["unsafe"])
    gm = lambda xs: math.exp(sum(math.log(max(x, 1e-9)) for x in xs) / len(xs)) if xs else None
    return {m: dict(geomean_wall_ratio=gm(d["wall"]), geomean_net_wall_ratio=gm(d["net"]),
                    geomean_steps_ratio=gm(d["steps"]),
                    mean_found_over_true=(sum(d["found"]) / len(d["found"])) if d["found"] else None,
                    min_found_over_true=min(d["found"]) if d["found"] else None,
                    unsafe=d["unsafe"], cases=len(d["wall"]))
            for m, d in by.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get("MEMFIT_BUILD", "build"),
                    help="build folder holding the memfit CLI (default: build)")
    ap.add_argument("--quick", action="store_true", help="one small budget per model (~2 min)")
    ap.add_argument("--json", nargs="?", const="-", metavar="PATH",
                    help="JSON results: on stdout instead of the table, or into PATH")
    ap.add_argument("--models", help="comma-separated subset of mlp,cnn,lstm,gpt")
    args = ap.parse_args(argv)

    memfit_bin = os.path.join(os.path.abspath(args.build), "memfit")
    if not os.access(memfit_bin, os.X_OK):
        ap.error(f"no memfit CLI at {memfit_bin}")
    config = QUICK if args.quick else FULL
    if args.models:
        keep = set(args.models.split(","))
        unknown = keep - set(MODEL_ARGS)
        if unknown:
            ap.error(f"unknown model(s) {sorted(unknown)}: choose from {list(MODEL_ARGS)}")
        config = [c for c in config if c[0] in keep]

    start = time.perf_counter()
    mtime0 = os.stat(memfit_bin).st_mtime
    startup = startup_seconds(memfit_bin)
    cases, failed = [], False
    for model, budget in config:
        log(f"[fit_baselines] {model} at {budget} ...")
        try:
            cases.append(run_case(memfit_bin, model, budget, startup))
        except Exception as e:  # one case's failure must not hide the others
            failed = True
            log(f"[fit_baselines]   failed: {type(e).__name__}: {str(e)[:300]}")
            cases.append(dict(model=model, budget=budget, true_max=None, rows=[],
                              error=f"{type(e).__name__}: {str(e)[:300]}"))
    wall = time.perf_counter() - start
    relinked = os.stat(memfit_bin).st_mtime != mtime0
    if relinked:
        log(f"[fit_baselines] warning: {memfit_bin} was rebuilt during the run; "
            "cases may mix two builds")
    ok = [c for c in cases if c["rows"]]
    result = dict(bench="fit_baselines", quick=args.quick, wall_seconds=wall,
                  process_start_seconds=startup, lightning=LIGHTNING,
                  accelerate=dict(starting_batch_size=ACCEL_START, factor=0.9,
                                  steps_counted_per_attempt=1),
                  cli_rebuilt_during_run=relinked, truth_steps=TRUTH_STEPS, memfit_probe_steps=MEMFIT_PROBE_STEPS,
                  cases=cases, summary=summary(ok))
    if args.json and args.json != "-":
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.json == "-":
        print(json.dumps(result, indent=2))
    else:
        print(f"memfit fit vs Lightning's finder and accelerate ({'quick' if args.quick else 'full'}; "
              f"simulated device on CPU, Adam; truth = largest batch whose {TRUTH_STEPS}-step "
              f"`memfit train --no-split` fits)")
        print("ratios are baseline / memfit: wall x = wall time, each run a process "
              f"(~{startup:.2f} s of it process start: JSON net_wall_ratio subtracts it); "
              f"steps x = real steps / memfit's {MEMFIT_PROBE_STEPS} probe steps (batches 4-16)")
        print(table(ok))
        for c in cases:
            if not c["rows"]:
                print(f"{c['model']} {c['budget']}: FAILED {c['error']}")
        for c in ok:
            tr = c["truth"]
            if not tr.get("monotone_near_boundary", True) or not tr.get("steady_by_step3", True):
                print(f"note: {c['model']} {c['budget']}: monotone near the boundary "
                      f"{tr.get('monotone_near_boundary')}, peak steady by step 3 "
                      f"{tr.get('steady_by_step3')} (step peaks {tr.get('step_peaks_at_max')})")
        print("summary over cases (geometric means of ratios):")
        for m, s in result["summary"].items():
            print(f"  {m:20s} wall x {fmt(s['geomean_wall_ratio'], '.1f')}  steps x "
                  f"{fmt(s['geomean_steps_ratio'], '.1f')}  found/true mean "
                  f"{fmt(s['mean_found_over_true'], '.3f')} min {fmt(s['min_found_over_true'], '.3f')}"
                  f"  unsafe {s['unsafe']}/{s['cases']}")
        mf = [r for c in ok for r in c["rows"] if r["method"] == "memfit"]
        bad = [r for r in mf if r.get("verify") and not r["verify"]["fits"]]
        print(f"  {'memfit':20s} found/true mean "
              f"{fmt(statistics.mean([r['found_over_true'] for r in mf if r.get('found_over_true')]) if mf else None, '.3f')}"
              f"  unsafe {sum(r['unsafe'] for r in mf)}/{len(mf)}  verification OOMs {len(bad)}")
        if relinked:
            print("warning: the memfit CLI was rebuilt during the run; cases may mix two builds")
        print(f"wall time {wall:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
