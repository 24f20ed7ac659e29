"""What `memfit advise` costs, in plain training steps of the same model in
the same run: the wall time of the command, less the
process's start-up, over the time of one plain step.

A plain step is timed by `memfit train` with no budget that matters: the
difference between --steps 2 and --steps 2+K runs, over K. Start-up
(loading torch, building the model) is the --steps 2 run less two steps;
for --mode meta, whose process is Python's (`python -m memfit`), it is
that of `python -m memfit train --steps 2`, which imports torch in Python.
Both modes of advise are measured: --mode cpu records every row on the CPU,
--mode meta records the rows on the meta device (torch's Python meta
kernels: it runs as `python -m memfit`). Figures are ratios within one run
of this script; the machine is noisy, so each command runs --runs times and
the medians are used. --baseline BUILD advises with that build too, each
run beside the other's, for a before/after ratio under the same load. CPU
seconds (user + system of the command) are printed beside the wall time:
they move less with the machine's load.

    PYTHONPATH=build/python .venv/bin/python bench/advise_cost.py [--build build] [--runs 3]
        [--baseline build-before]
"""

import argparse
import os
import resource
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import wall  # noqa: E402


def cpu_wall(cmd, env, ok):
    """Wall seconds, CPU seconds (user + system) and stdout of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t, out = wall(cmd, env, ok)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return t, cpu, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get("MEMFIT_BUILD", "build"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--budget", default="64MiB")
    ap.add_argument("--steps", type=int, default=10, help="K: the extra steps timed")
    ap.add_argument("--baseline", default=None,
                    help="another build to advise with, run by run beside --build")
    args = ap.parse_args(argv)

    memfit = os.path.join(args.build, "memfit")
    env = dict(os.environ, PYTHONPATH=os.path.join(args.build, "python"))
    model = ["--model", "gpt", "--batch", str(args.batch)]
    train = [memfit, "train", *model, "--budget", "64GiB", "--seed", "0", "--no-split"]
    # Wall and CPU seconds of --steps 2 and 2+K, medians.
    walls, cpus = {}, {}
    for k in (2, 2 + args.steps):
        runs = [cpu_wall(train + ["--steps", str(k)], None, (0,)) for _ in range(args.runs)]
        walls[k] = statistics.median(w for w, _, _ in runs)
        cpus[k] = statistics.median(c for _, c, _ in runs)
    step = (walls[2 + args.steps] - walls[2]) / args.steps
    startup = max(0.0, walls[2] - 2 * step)
    cpu_step = (cpus[2 + args.steps] - cpus[2]) / args.steps
    cpu_startup = max(0.0, cpus[2] - 2 * cpu_step)
    # Python's start-up, for --mode meta: python -m memfit train --steps 2
    # less the two steps timed above.
    py_runs = [cpu_wall([sys.executable, "-m", "memfit", *train[1:], "--steps", "2"], env, (0,))
               for _ in range(args.runs)]
    py_startup = max(0.0, statistics.median(w for w, _, _ in py_runs) - 2 * step)
    py_cpu_startup = max(0.0, statistics.median(c for _, c, _ in py_runs) - 2 * cpu_step)
    print(f"gpt, batch {args.batch}, adam, budget {args.budget}: one plain step {step * 1e3:.0f} ms, "
          f"start-up {startup:.1f} s, in Python {py_startup:.1f} s ({cpu_step * 1e3:.0f} ms, "
          f"{cpu_startup:.1f} and {py_cpu_startup:.1f} CPU s; medians of {args.runs} runs)")
    advise = ["advise", *model, "--budget", args.budget, "--quiet"]
    builds = [("", args.build)] + ([("baseline ", args.baseline)] if args.baseline else [])
    for mode in ("cpu", "meta"):
        runs = {label: [] for label, _ in builds}
        plans = {}
        for _ in range(args.runs):
            for label, build in builds:
                e = dict(os.environ, PYTHONPATH=os.path.join(build, "python"))
                cmd = ([os.path.join(build, "memfit")] if mode == "cpu"
                       else [sys.executable, "-m", "memfit"]) + [*advise, "--mode", mode]
                t, cpu, out = cpu_wall(cmd, e, (0, 2))
                runs[label].append((t, cpu))
                plans[label] = next((line for line in out.splitlines()
                                     if line.startswith("plan:")), "plan: ?")
        s0, c0 = (startup, cpu_startup) if mode == "cpu" else (py_startup, py_cpu_startup)
        for label, _ in builds:
            t = statistics.median(w for w, _ in runs[label])
            cpu = statistics.median(c for _, c in runs[label])
            print(f"{label}advise --mode {mode}: {t:.1f} s = {(t - s0) / step:.1f} plain steps "
                  f"({cpu:.1f} CPU s = {(cpu - c0) / cpu_step:.1f} plain steps' CPU); "
                  f"{plans[label]}")


if __name__ == "__main__":
    main()
