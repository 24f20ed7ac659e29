"""The log a fit-corpus run prints (bench/fit_corpus.py) and CI's gate reads
(scripts/corpus_gate.py): one row per fit, one FAILED line per model that
did not run, and a header that names the run's truth. Writer and reader
share this one format."""

from __future__ import annotations

import re

__all__: list = []

# The header's words for each truth: the gate passes only logs whose every
# header names plain steps.
PLAIN_TRUTH = "plain steps on memfit.simulated_device(budget), no recorder"
REPLAY_TRUTH = "memfit own allocator replay (memfit measuring itself: no card here)"

COLUMNS = (f"{'model':<30} thr {'found':>6} {'true':>6} {'ratio':>6} over trials affine "
           f"{'pred@2B':>9} {'cost':>6} {'B':>4} {'secs':>5}")

_ROW = re.compile(r"^(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+[\d.]+\s+(YES|no)\s+(\d+)\s+(True|False)\s+"
                  r"([-+\d.]+)%\s+([\d.]+)x\s+(\d+)\s+\d+\s*$")
_FAILED = re.compile(r"^(\S+)\s+(\d+)\s+FAILED\s+(.*)$")


def format_row(name: str, threads: int, r: dict, seconds: float) -> str:
    """One fit's row: r holds found, truth, overshoot, trials, affine,
    pred_err (a fraction), cost (plain steps) and large (2B)."""
    return (f"{name:<30} {threads:>3} {r['found']:>6} {r['truth']:>6} "
            f"{r['found'] / r['truth']:>6.3f} {'YES' if r['overshoot'] else 'no':>4} "
            f"{r['trials']:>6} {str(r['affine']):>6} {100 * r['pred_err']:>+8.2f}% "
            f"{r['cost']:>5.1f}x {r['large'] // 2:>4} {seconds:>5.0f}")


def format_failed(name: str, threads: int, why: str) -> str:
    return f"{name:<30} {threads:>3} FAILED {why}"


def rows_from_logs(paths) -> list:
    """The rows printed by earlier runs (a run cut short, or split by thread
    count or by model) as (name, threads, r): the last row of each (model,
    threads) wins."""
    rows = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                m = _ROW.match(line.rstrip("\n"))
                if not m:
                    continue
                name, thr, found, truth, over, trials, affine, err, cost, b = m.groups()
                rows[(name, int(thr))] = dict(
                    found=int(found), truth=int(truth), overshoot=over == "YES",
                    self_over_bytes=0, trials=int(trials), affine=affine == "True",
                    pred_err=float(err) / 100, cost=float(cost), large=2 * int(b))
    return [(name, thr, r) for (name, thr), r in rows.items()]


def failures_in_log(path) -> list:
    """(name, threads, why) of every FAILED line."""
    with open(path) as f:
        return [(m.group(1), int(m.group(2)), m.group(3))
                for m in map(_FAILED.match, (line.rstrip("\n") for line in f)) if m]
