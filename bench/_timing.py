"""Timing helpers the overhead benchmarks share (the leading underscore keeps
bench/run_all.py from running it)."""

import statistics
import subprocess
import sys
import time


def timed(fn, n):
    """Mean seconds of one call of fn over n calls in a row."""
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def wall(cmd, env=None, ok=(0,)):
    """Seconds and stdout of one run of the command `cmd` (a list); exits
    with its stderr when its status is not in `ok`."""
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode not in ok:
        sys.stderr.write(out.stderr)
        raise SystemExit(f"failed ({out.returncode}): {' '.join(cmd)}")
    return time.perf_counter() - t0, out.stdout


def median_wall(cmd, runs, env=None, ok=(0,)):
    """Median seconds of `runs` runs of `cmd`, and the last run's stdout:
    these machines are noisy."""
    times, last = [], ""
    for _ in range(runs):
        t, last = wall(cmd, env, ok)
        times.append(t)
    return statistics.median(times), last
