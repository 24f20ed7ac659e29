#!/usr/bin/env python3
"""The same reports from two builds of the memfit command: profile (cpu,
--target cuda, --mode meta), fit and advise on the built-in models, as JSON
with every time field removed, compared key by key. For a restructuring that
must not change what memfit says (build the old commit's CLI in a worktree).

    python3 bench/cli_parity.py OLD/build/memfit build/memfit [--only TEXT]
"""

import argparse
import json
import subprocess

# Keys whose values differ from run to run (times), left out of the comparison.
TIMEY = ("_ns", "ms", "time", "seconds", "ratio", "elapsed", "wall")


def without_times(o):
    if isinstance(o, dict):
        return {k: without_times(v) for k, v in o.items() if not any(t in k for t in TIMEY)}
    if isinstance(o, list):
        return [without_times(v) for v in o]
    return o


def commands():
    for m in ["mlp", "cnn", "gpt", "lstm", "resnet18"]:
        yield ["profile", "--model", m, "--batch", "8", "--json"]
        yield ["profile", "--model", m, "--batch", "8", "--json", "--target", "cuda"]
        yield ["profile", "--model", m, "--batch", "8", "--json", "--mode", "meta"]
    for m, b in [("mlp", "16MiB"), ("cnn", "48MiB"), ("gpt", "64MiB"), ("lstm", "32MiB")]:
        yield ["fit", "--model", m, "--budget", b, "--json"]
    for m, b in [("mlp", "8MiB"), ("gpt", "64MiB")]:
        yield ["advise", "--model", m, "--batch", "8", "--budget", b, "--json", "--repeats",
               "0", "--quiet"]


def report(exe, command):
    r = subprocess.run([exe] + command, capture_output=True, text=True, timeout=600)
    try:
        return without_times(json.loads(r.stdout))
    except ValueError:
        return ("exit", r.returncode, r.stdout[-200:], r.stderr[-300:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--only", help="only the commands whose text holds this")
    args = ap.parse_args()
    same = different = 0
    for c in commands():
        text = " ".join(c)
        if args.only and args.only not in text:
            continue
        a, b = report(args.old, c), report(args.new, c)
        if a == b:
            same += 1
            print("same", text, flush=True)
            continue
        different += 1
        print("DIFF", text, flush=True)
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                if a.get(k) != b.get(k):
                    print("   key", k, str(a.get(k))[:150], "|", str(b.get(k))[:150])
        else:
            print("  ", str(a)[:300], "\n  ", str(b)[:300])
    print(f"{same} same, {different} different")


if __name__ == "__main__":
    main()
