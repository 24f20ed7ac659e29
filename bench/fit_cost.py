"""What `memfit fit` costs, in plain training steps at the batch it returns:
the wall time of the command, less the process's
start-up, over the time of one plain step at its answer, both measured in
this run.

A plain step is timed by `memfit train` with a budget that does not bind:
the difference between --steps 2 and --steps 2+K runs, over K. Start-up
(loading torch, building the model) is the --steps 2 run less two steps.
The fit's own work is its probes (small batches grown toward the answer)
and the verifying step at the answer, two iterations under the recorder:
that step alone is about 2 plain steps. Each command runs --runs times and
the medians are used: the machine is noisy.

    PYTHONPATH=build/python .venv/bin/python bench/fit_cost.py [--build build] [--runs 3]
        [--models gpt,mlp,cnn] [--budget 256MiB]
"""

import argparse
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import median_wall  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get("MEMFIT_BUILD", "build"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--models", default="gpt,mlp,cnn")
    ap.add_argument("--budget", default="256MiB")
    ap.add_argument("--steps", type=int, default=6, help="K: the extra plain steps timed")
    args = ap.parse_args(argv)
    memfit = os.path.join(args.build, "memfit")
    print(f"memfit fit --budget {args.budget}, cpu mode; medians of {args.runs} runs")
    print(f"{'model':<6} {'answer':>6} {'trials':>6} {'probes':<16} {'fit s':>6} "
          f"{'step ms':>8} {'cost':>6}")
    costs = []
    for name in args.models.split(","):
        fit_s, out = median_wall([memfit, "fit", "--model", name, "--budget", args.budget],
                                 args.runs)
        batch = int(re.search(r"under [^:]+: (\d+)", out).group(1))
        trials = re.search(r"(\d+) full-size trial", out)
        probes = re.search(r"(\d+) probes up to batch (\d+)", out)
        train = [memfit, "train", "--model", name, "--batch", str(batch), "--budget", "64GiB",
                 "--seed", "0", "--no-split"]
        short, _ = median_wall(train + ["--steps", "2"], args.runs)
        long, _ = median_wall(train + ["--steps", str(2 + args.steps)], args.runs)
        step = (long - short) / args.steps
        startup = max(0.0, short - 2 * step)
        cost = (fit_s - startup) / step
        costs.append(cost)
        print(f"{name:<6} {batch:>6} {trials.group(1) if trials else '?':>6} "
              f"{(probes.group(1) + ' up to ' + probes.group(2)) if probes else '?':<16} "
              f"{fit_s:>6.1f} {step * 1e3:>8.0f} {cost:>5.1f}x", flush=True)
    print(f"median cost {statistics.median(costs):.1f} plain steps at the answer "
          f"(of which the verifying step, two recorded iterations, is about 2)")


if __name__ == "__main__":
    main()
