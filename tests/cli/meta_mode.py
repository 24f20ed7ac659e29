"""meta_mode.py MEMFIT [PYTHON_PACKAGE_DIR]: `memfit profile --mode meta`, the
program alone (no Python in the process), records mlp, cnn, gpt and resnet18
on the meta device, not on the CPU after a fallback (Note [Native meta
kernels], src/torch/native_meta.cpp). With the package's directory, the same
command run inside Python (torch's Python meta kernels loaded) gives the same
phases, byte for byte."""
import json
import os
import subprocess
import sys

memfit = sys.argv[1]
package = sys.argv[2] if len(sys.argv) > 2 else None


def profile(command, model):
    done = subprocess.run(command + ["profile", "--model", model, "--batch", "8", "--mode",
                                     "meta", "--json", "--quiet"],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=package or ""))
    assert done.returncode == 0, (model, done.stderr)
    return json.loads(done.stdout)


for model in ["mlp", "cnn", "gpt", "resnet18"]:
    alone = profile([memfit], model)
    assert alone["mode"] == "meta", (model, alone["mode"], alone.get("notes"))
    assert "notes" not in alone, (model, alone["notes"])
    if package:
        inside = profile([sys.executable, "-m", "memfit"], model)
        assert inside["mode"] == "meta", (model, inside.get("notes"))
        for key in ["peak_bytes", "phases", "categories_at_peak", "modules"]:
            assert alone[key] == inside[key], (model, key)
    print(f"{model}: meta, peak {alone['peak_bytes']} bytes")
