"""`memfit` as pip installs it runs meta mode whole on every built-in model:
torch 2.x registers many meta kernels (relu, index_select, convolution
backward) from Python, and the command runs inside Python to have them."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.torch_api  # see python/tests/conftest.py

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


def profile(model, mode, batch=4):
    out = subprocess.run(
        [sys.executable, "-m", "memfit", "profile", "--model", model, "--batch", str(batch),
         "--mode", mode, "--json"],
        capture_output=True, text=True, env=ENV, check=True,
    ).stdout
    return json.loads(out)


# Not lstm: the CPU runs LSTM through its own fused kernels, meta through the
# composite (one mm and add per step): other outputs, by design of the kernels.
@pytest.mark.slow
@pytest.mark.parametrize("model", ["mlp", "cnn", "gpt", "resnet18"])
def test_meta_mode_runs_whole_and_agrees_with_cpu(model):
    meta, cpu = profile(model, "meta"), profile(model, "cpu")
    assert meta["mode"] == "meta"
    # What stays alive between phases is the same tensors on every device,
    # to the byte. Peaks inside a phase differ by what kernels allocate for
    # themselves: the CPU's convolution backward takes a workspace meta has
    # not (resnet18: -24% at batch 16); torch's Python meta kernels for
    # attention allocate intermediates the CPU's fused kernels do not (gpt:
    # +4%). The README's meta table gives each figure.
    assert [p["live_bytes_after"] for p in meta["phases"]] == [
        p["live_bytes_after"] for p in cpu["phases"]
    ]
    assert meta["categories_at_peak"]["parameter"] == cpu["categories_at_peak"]["parameter"]


def test_lstm_runs_in_meta_mode_too():
    assert profile("lstm", "meta")["mode"] == "meta"


def test_cli_errors_are_one_line_with_the_exit_status():
    r = subprocess.run([sys.executable, "-m", "memfit", "profile", "--model", "mlp",
                        "--batch", "4", "--width", "0", "--model", "gpt"],
                       capture_output=True, text=True, env=ENV)
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
