"""What `memfit advise` costs, in plain training steps of the same model in
the same run (issue #15 item 4): the wall time of the command, less the
process's start-up, over the time of one plain step.

A plain step is timed by `memfit train` with no budget that matters: the
difference between --steps 2 and --steps 2+K runs, over K. Start-up
(loading torch, building the model) is the --steps 2 run less two steps.
Both modes of advise are measured: --mode cpu records every row on the CPU,
--mode meta records the rows on the meta device (torch's Python meta
kernels: it runs as `python -m memfit`). Figures are ratios within one run
of this script; the machine is noisy, so each command runs --runs times and
the medians are used.

    PYTHONPATH=build/python .venv/bin/python bench/advise_cost.py [--build build] [--runs 3]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import median_wall  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get("MEMFIT_BUILD", "build"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--budget", default="64MiB")
    ap.add_argument("--steps", type=int, default=10, help="K: the extra steps timed")
    args = ap.parse_args(argv)

    memfit = os.path.join(args.build, "memfit")
    env = dict(os.environ, PYTHONPATH=os.path.join(args.build, "python"))
    model = ["--model", "gpt", "--batch", str(args.batch)]
    train = [memfit, "train", *model, "--budget", "64GiB", "--seed", "0", "--no-split"]
    short, _ = median_wall(train + ["--steps", "2"], args.runs)
    long, _ = median_wall(train + ["--steps", str(2 + args.steps)], args.runs)
    step = (long - short) / args.steps
    startup = max(0.0, short - 2 * step)
    print(f"gpt, batch {args.batch}, adam, budget {args.budget}: one plain step {step * 1e3:.0f} ms, "
          f"start-up {startup:.1f} s (medians of {args.runs} runs)")
    advise = ["advise", *model, "--budget", args.budget, "--quiet"]
    for mode, cmd, e in (
        ("cpu", [memfit, *advise, "--mode", "cpu"], None),
        ("meta", [sys.executable, "-m", "memfit", *advise, "--mode", "meta"], env),
    ):
        t, out = median_wall(cmd, args.runs, e, ok=(0, 2))
        plan = next((line for line in out.splitlines() if line.startswith("plan:")), "plan: ?")
        print(f"advise --mode {mode}: {t:.1f} s = {(t - startup) / step:.1f} plain steps; {plan}")


if __name__ == "__main__":
    main()
