"""scripts/gpu_check.sh --native: its dry run lists the cases without a GPU,
and its plain-step bisection finds the largest batch that runs."""

import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_native_dry_run_lists_at_least_eight_cases(tmp_path):
    env = dict(os.environ, MEMFIT_PYTHON=sys.executable, MEMFIT_GPU_BUILD=str(tmp_path / "b"))
    env.pop("OUT", None)
    done = subprocess.run([os.path.join(ROOT, "scripts", "gpu_check.sh"), "--native", "--dry-run"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    cases = [l for l in done.stdout.splitlines() if l.startswith("case ")]
    assert len(cases) >= 8, done.stdout
    names = " ".join(cases)
    for part in ("mlp_256MiB", "cnn_cudnn", "gpt", "resnet18", "hf_gpt2", "hf_llama", "compiled",
                 "lstm"):
        assert part in names


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
