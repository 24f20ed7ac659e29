"""Timing helpers the overhead benchmarks share (the leading underscore keeps
bench/run_all.py from running it)."""

import time


def timed(fn, n):
    """Mean seconds of one call of fn over n calls in a row."""
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n
