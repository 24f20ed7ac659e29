"""The pass/fail of a bench/fit_corpus.py run for CI (scripts/check_torch_wheel.sh):
fit_corpus.py itself fails only on an overshoot; here a model that did not
run, a fit below the ratio, too few models, or a run whose truth was not
plain steps (--target cuda's is memfit's own replay) fail too.

    python scripts/corpus_gate.py [--min-models 8] [--min-ratio 0.98] [--expect a,b] LOG
"""

import argparse
import sys

from memfit.testing.corpus_log import PLAIN_TRUTH, failures_in_log, rows_from_logs

__all__ = ["problems", "main"]


def problems(log: str, min_models: int, min_ratio: float, expect: list) -> tuple:
    """(the rows, one line per reason to fail)."""
    rows = rows_from_logs([log])
    why = [f"{name} ({threads} thr) failed: {reason}"
           for name, threads, reason in failures_in_log(log)]
    headers = 0
    with open(log) as f:
        for line in f:
            if "true max: " in line:
                headers += 1
                if PLAIN_TRUTH not in line:
                    why.append(f"a run's truth is not plain steps: {line.strip()[:160]}")
    if not headers:
        why.append("no run's header says what its truth was")
    ran = {name for name, _, _ in rows}
    why += [f"{name} has no result in the log" for name in expect if name not in ran]
    if len(ran) < min_models:
        why.append(f"{len(ran)} models ran, at least {min_models} must")
    for name, threads, r in rows:
        ratio = r["found"] / r["truth"]
        if r["overshoot"]:
            why.append(f"{name} ({threads} thr) overshoots: batch {r['found']} is over the budget")
        if ratio < min_ratio:
            why.append(f"{name} ({threads} thr) found/true {r['found']}/{r['truth']} = "
                       f"{ratio:.3f} < {min_ratio}")
    return rows, why


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log")
    ap.add_argument("--min-models", type=int, default=8)
    ap.add_argument("--min-ratio", type=float, default=0.98)
    ap.add_argument("--expect", default="", help="comma-separated models that must have run")
    a = ap.parse_args(argv)
    rows, why = problems(a.log, a.min_models, a.min_ratio, [m for m in a.expect.split(",") if m])
    ratios = [r["found"] / r["truth"] for _, _, r in rows]
    print(f"corpus gate: {len({n for n, _, _ in rows})} models, {len(rows)} fits, overshoots "
          f"{sum(r['overshoot'] for _, _, r in rows)}, found/true min "
          f"{min(ratios) if ratios else float('nan'):.3f} (at least {a.min_ratio} needed)")
    for line in why:
        print(f"corpus gate: FAIL {line}")
    return 1 if why else 0


if __name__ == "__main__":
    sys.exit(main())
