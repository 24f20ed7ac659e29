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


MODELS = ["mlp", "cnn", "gpt", "resnet18"]


def flags(model):
    return ["profile", "--model", model, "--batch", "8", "--mode", "meta", "--json", "--quiet"]


def alone(model):
    done = subprocess.run([memfit] + flags(model), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (model, done.stderr)
    return json.loads(done.stdout)


# `python -m memfit` is memfit.command.main: one interpreter runs it for each
# model in turn, so Python starts, imports torch (2.5 s on two cores) and
# loads torch's Python meta kernels (1.7 s) once, not once per model. Each
# run's JSON is the output between two marker lines.
INSIDE = """
import sys
from memfit.command import main
for model in sys.argv[1:]:
    print("@@ begin " + model, flush=True)
    try:
        main([model if a == "MODEL" else a for a in %r])
    except SystemExit as e:
        print("@@ exit", model, e.code, flush=True)
""" % flags("MODEL")


def inside(models):
    done = subprocess.run([sys.executable, "-c", INSIDE] + models, capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, PYTHONPATH=package))
    assert done.returncode == 0, done.stderr
    out, lines = {}, done.stdout.splitlines()
    for model in models:
        begin = lines.index("@@ begin " + model) + 1
        end = next(i for i in range(begin, len(lines)) if lines[i].startswith("@@ exit " + model))
        assert lines[end] == f"@@ exit {model} 0", (lines[end], done.stderr)
        out[model] = json.loads("\n".join(lines[begin:end]))
    return out


inside_reports = inside(MODELS) if package else {}
for model in MODELS:
    report = alone(model)
    assert report["mode"] == "meta", (model, report["mode"], report.get("notes"))
    assert "notes" not in report, (model, report["notes"])
    if package:
        other = inside_reports[model]
        assert other["mode"] == "meta", (model, other.get("notes"))
        for key in ["peak_bytes", "phases", "categories_at_peak", "modules"]:
            assert report[key] == other[key], (model, key)
    print(f"{model}: meta, peak {report['peak_bytes']} bytes")
