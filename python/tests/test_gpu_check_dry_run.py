"""scripts/gpu_check.sh --native --dry-run on a machine with no GPU and no
torch: it lists the card check's cases and exits 0."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = ("mlp_256MiB", "cnn_cudnn", "gpt", "resnet18", "hf_gpt2", "hf_llama", "lstm", "compiled")


def _python_without_torch(tmp_path):
    """A python3 whose `import torch` fails, as on a machine without it."""
    shadow = tmp_path / "no_torch" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no torch on this machine')\n")
    wrapper = tmp_path / "python3"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={shadow.parent} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper)


def test_native_dry_run_lists_the_cases_without_torch_or_a_gpu(tmp_path):
    python = _python_without_torch(tmp_path)
    assert subprocess.run([python, "-c", "import torch"], capture_output=True).returncode != 0
    env = dict(os.environ, MEMFIT_PYTHON=python, MEMFIT_GPU_BUILD=str(tmp_path / "b"),
               CUDA_VISIBLE_DEVICES="")
    env.pop("OUT", None)
    done = subprocess.run([os.path.join(ROOT, "scripts", "gpu_check.sh"), "--native", "--dry-run"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    cases = [line for line in done.stdout.splitlines() if line.startswith("case ")]
    assert len(cases) == len(CASES), done.stdout
    for name, line in zip(CASES, cases):
        assert name in line and "MiB" in line
    assert not (tmp_path / "b" / "CMakeCache.txt").exists()  # nothing was built
