"""Meta mode against a real CPU step, for every built-in model, through the
`memfit` command as pip installs it (inside Python, where torch's Python
meta kernels are loaded):

    PYTHONPATH=build/python .venv/bin/python bench/meta_vs_cpu.py [--quick] [--batch 16]

Prints each model's peak in both modes, the error, whether the bytes alive
after every phase agree, and the time of each run as a ratio."""

import argparse
import json
import os
import subprocess
import sys
import time

import torch

MODELS = ["mlp", "cnn", "gpt", "lstm", "resnet18"]


def profile(model, mode, batch):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "memfit", "profile", "--model", model,
                          "--batch", str(batch), "--mode", mode, "--json"],
                         capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(out), time.perf_counter() - start


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="batch 4")
    ap.add_argument("--batch", type=int, default=16)
    a = ap.parse_args(argv)
    batch = 4 if a.quick else a.batch
    print(f"torch {torch.__version__}, batch {batch}, optimizer adam, two iterations")
    print("| model | mode | cpu peak | meta peak | error | live after every phase | meta time / cpu time |")
    print("|---|---|---|---|---|---|---|")
    for m in MODELS:
        cpu, tc = profile(m, "cpu", batch)
        meta, tm = profile(m, "meta", batch)
        same = [p["live_bytes_after"] for p in cpu["phases"]] == [
            p["live_bytes_after"] for p in meta["phases"]]
        err = (meta["peak_bytes"] - cpu["peak_bytes"]) / cpu["peak_bytes"]
        print(f"| {m} | {meta['mode']} | {cpu['peak_bytes'] / 2**20:.2f} MiB | "
              f"{meta['peak_bytes'] / 2**20:.2f} MiB | {err:+.2%} | "
              f"{'equal' if same else 'differ'} | {tm / tc:.2f}x |")


if __name__ == "__main__":
    main()
