"""What each memory strategy saves and costs on memfit's gpt, measured by
`memfit advise`: the peak of each transformed step (recorded profile), its
saving against the plain step, its step time as a ratio to the plain step's
(same process, median of --repeats steps, CPU), and the checkpointing rules
(every layer, sqrt(n), every k-th, memfit's optimal plan) compared on the
chain, with recompute as a share of checkpointing every layer's.

The budget is set where even batch 1 does not fit plainly: a fraction (0.8
by default) of the plain batch-1 peak that `memfit profile` measures, so the
plan needs more than micro-batching. A long context makes the attention
activations outweigh the parameters and Adam's state, as in long-sequence
training; with the default context the optimizer step holds the peak at
batch 1 and only approximate strategies (bf16, a lighter optimizer) help.

    PYTHONPATH=build/python .venv/bin/python bench/strategies.py [--quick] [--build build] [--json [PATH]]
"""

import argparse
import json
import os
import subprocess
import sys
import time

MIB = 1 << 20


def run(cmd):
    t0 = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode not in (0, 2):
        sys.stderr.write(out.stderr)
        raise SystemExit(f"failed ({out.returncode}): {' '.join(cmd)}")
    return out, time.time() - t0


def _ratio(row):
    """'1.25x' timed, '~1.25x' estimated from the recorded times, '-' unknown."""
    r = row["time_ratio"]
    if r is None:
        return "-"
    return ("" if row["time_measured"] else "~") + f"{r:.2f}x"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get("MEMFIT_BUILD", "build"))
    ap.add_argument("--quick", action="store_true", help="a smaller gpt, one timed step each")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--fraction", type=float, default=0.8,
                    help="budget as a fraction of the plain batch-1 peak")
    ap.add_argument("--json", nargs="?", const="-", default=None,
                    help="also write the advice as JSON (to PATH, or stdout)")
    args = ap.parse_args(argv)

    memfit = os.path.join(args.build, "memfit")
    if args.quick:
        model = ["--model", "gpt", "--layers", "4", "--width", "64", "--context", "256"]
        repeats = "1"
    else:
        model = ["--model", "gpt", "--layers", "6", "--width", "128", "--context", "512"]
        repeats = "3"

    out, _ = run([memfit, "profile", *model, "--batch", "1", "--json"])
    plain1 = json.loads(out.stdout)["peak_bytes"]
    budget = int(plain1 * args.fraction)
    out, wall = run([memfit, "advise", *model, "--batch", str(args.batch), "--budget",
                     str(budget), "--repeats", repeats, "--json",
                     "--allow-approximate"])  # every row, bf16 too
    a = json.loads(out.stdout)
    plain = a["plain_peak_bytes"]

    print(f"gpt {' '.join(model[2:])}, batch {args.batch}, adam; plain batch-1 peak "
          f"{plain1 / MIB:.2f} MiB, budget {budget / MIB:.2f} MiB ({args.fraction:g}x of it)")
    print(f"plain step at batch {args.batch}: peak {plain / MIB:.2f} MiB, "
          f"{a['plain_step_ms']:.0f} ms; advise took {wall:.0f} s\n")
    print(f"{'strategy':50s} {'peak/plain':>10s} {'saving':>11s} {'time':>6s}  fits  result")
    for s in a["strategies"]:
        result = "no training" if s["kind"] == "eval" else ("same" if s["exact"] else "changes")
        print(f"{s['name']:50s} {s['peak_bytes'] / plain:9.2f}x "
              f"{s['saving_bytes'] / MIB:7.2f} MiB {_ratio(s):>6s}  "
              f"{'yes' if s['fits'] else 'no ':3s}   {result}")
    rules = a["checkpoint_rules"]
    every = next((r for r in rules if r["rule"] == "every layer"), None)
    if rules and every:
        print("\ncheckpointing rules (predicted on the chain the plan was made for)")
        print(f"{'rule':18s} {'blocks':14s} {'peak/budget':>11s} {'recompute':>10s}  fits")
        for r in rules:
            share = r["recompute_ns"] / every["recompute_ns"] if every["recompute_ns"] else 0
            print(f"{r['rule']:18s} {r['blocks']:14s} {r['predicted_peak_bytes'] / budget:10.2f}x "
                  f"{share:9.2f}x  {'yes' if r['fits'] else 'no'}")
    p = a["plan"]
    print(f"\nplan: {p['summary']}: " + (
        f"peak {p['peak_bytes'] / MIB:.2f} MiB = {p['peak_bytes'] / budget:.2f}x of the budget, "
        f"time {_ratio(p)} of the plain step"
        if p["found"] else "nothing measured fits"))
    for n in a["notes"]:
        print("note:", n)
    if args.json:
        doc = json.dumps({"budget_bytes": budget, "plain_batch1_peak_bytes": plain1,
                          "advise_wall_s": wall, "advice": a}, indent=2)
        if args.json == "-":
            print(doc)
        else:
            with open(args.json, "w") as f:
                f.write(doc + "\n")
    return 0 if p["found"] else 1


if __name__ == "__main__":
    sys.exit(main())
