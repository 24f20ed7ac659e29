"""scripts/gpu_check.sh --native: its plain-step bisection finds the largest
batch that runs (its dry run: test_gpu_check_dry_run.py)."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _native_check():
    spec = importlib.util.spec_from_file_location(
        "native_check", os.path.join(ROOT, "bench", "gpu", "native_check.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_true_max_bisection_finds_the_largest_batch_that_runs(monkeypatch):
    nc = _native_check()
    monkeypatch.setattr(nc, "clean", lambda: None)
    for limit, start in ((100, 100), (100, 37), (100, 400), (1, 5), (5000, 3)):
        monkeypatch.setattr(nc, "plain_steps", lambda m, mb, lf, b, n=limit: b <= n)
        batch, trials, start_ran = nc.true_max(None, None, None, start)
        assert batch == limit and start_ran == (start <= limit)
        assert trials < 40
