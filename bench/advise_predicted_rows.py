"""The error of the rows `memfit advise` predicts instead of recording
(Note [Rows advise predicts]): each case is advised twice, as it runs
(rows predicted, marked "~") and with --record-every-row (every row
recorded); each predicted row's peak is compared with the same row
recorded, and the two plans must be the same.

    PYTHONPATH=build/python .venv/bin/python bench/advise_predicted_rows.py [--build build]

Bytes do not depend on the machine's load. Exits 1 when a plan differs or a
prediction is under its recorded row by more than --tolerance bytes.
"""

import argparse
import json
import os
import subprocess
import sys

# (model, budget, extra flags): the built-in models, a budget none of them
# meets with the plain step, both devices of rows, and a CUDA target (the
# caching allocator replayed on the predicted steps too).
CASES = [
    ("gpt", "64MiB", ["--mode", "cpu"]),
    ("gpt", "64MiB", ["--mode", "meta"]),
    ("gpt", "64MiB", ["--mode", "cpu", "--target", "cuda"]),
    ("gpt", "40MiB", ["--mode", "cpu"]),
    ("mlp", "10MiB", ["--mode", "cpu"]),
    ("mlp", "10MiB", ["--mode", "cpu", "--optimizer", "momentum"]),
    ("cnn", "10MiB", ["--mode", "cpu"]),
    ("cnn", "10MiB", ["--mode", "meta"]),
    ("lstm", "16MiB", ["--mode", "cpu"]),
]


def advise(cmd, env):
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode not in (0, 2):
        sys.stderr.write(out.stderr)
        raise SystemExit(f"failed ({out.returncode}): {' '.join(cmd)}")
    return json.loads(out.stdout)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get("MEMFIT_BUILD", "build"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tolerance", type=int, default=0,
                    help="bytes a prediction may be under its recorded row")
    args = ap.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=os.path.join(args.build, "python"))
    memfit = os.path.join(args.build, "memfit")
    worst_under, worst_over, worst_pct, failed, n = 0, 0, 0.0, False, 0
    print(f"{'case':<44} {'row':<52} {'predicted':>11} {'recorded':>11} {'error':>9} {'%':>7}")
    for model, budget, flags in CASES:
        # meta rows come from torch's Python meta kernels: the command as
        # `python -m memfit` runs it.
        head = ([sys.executable, "-m", "memfit"] if "meta" in flags else [memfit])
        cmd = head + ["advise", "--model", model, "--batch", str(args.batch), "--budget", budget,
                      "--json", "--quiet", "--repeats", "0", *flags]
        fast, full = advise(cmd, env), advise(cmd + ["--record-every-row"], env)
        case = f"{model} {budget} {' '.join(flags)}"
        recorded = {r["name"]: r for r in full["strategies"]}
        for r in fast["strategies"]:
            if not r["predicted"]:
                continue
            if r["name"] not in recorded:
                print(f"{case:<44} {r['name'][:52]:<52} not a row when every row is recorded")
                continue
            p, m = r["peak_bytes"], recorded[r["name"]]["peak_bytes"]
            err = p - m
            pct = 100.0 * err / m if m else 0.0
            n += 1
            worst_under, worst_over = min(worst_under, err), max(worst_over, err)
            worst_pct = max(worst_pct, abs(pct))
            failed |= -err > args.tolerance
            print(f"{case:<44} {r['name'][:52]:<52} {p:>11} {m:>11} {err:>+9} {pct:>+6.2f}%")
        same = (fast["plan"]["summary"], fast["plan"]["peak_bytes"]) == (
            full["plan"]["summary"], full["plan"]["peak_bytes"])
        failed |= not same
        print(f"{case:<44} plan {'the same' if same else 'DIFFERS'}: {fast['plan']['summary']}, "
              f"{fast['plan']['peak_bytes']} B (verified: {fast['plan']['verified']}); "
              f"real recordings {fast['plan']['recordings']} vs {full['plan']['recordings']}")
    print(f"{n} predicted rows: error from {worst_under:+d} to {worst_over:+d} bytes, "
          f"at most {worst_pct:.2f}% of the recorded peak")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
