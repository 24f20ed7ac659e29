"""How long a new user's `pip install --no-build-isolation .` takes: a cold
build (an empty build folder, CCACHE_DISABLE=1) on this machine, its total
wall time and CPU time, and the slowest translation units and links (from the
kept build folder's .ninja_log). A benchmark, not a test.

    python bench/install_time.py [--variant NAME=-C...] [--top 12] [--install]

Run it with the Python whose torch to build against (a venv's python).
Without --install it runs `pip wheel --no-build-isolation --no-deps` (the
build half of pip install; no venv changes); with --install, the real
`pip install --no-build-isolation .` into that Python's environment. Each
--variant adds a build with extra pip arguments, measured in the same run
against the default, e.g. the build with precompiled torch headers (Note
[Precompiled torch headers]; the wheel's default is without):

    --variant pch=-Ccmake.define.MEMFIT_PRECOMPILE_HEADERS=ON

The machine's load average is printed beside each build: on a shared
machine the wall times move with it, the CPU times much less.
"""

import argparse
import collections
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

__all__ = ["build", "ninja_steps", "main"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ninja_steps(build_dir: str) -> list:
    """(seconds, output) of every step of the last build, slowest first; a
    step that ran more than once counts its last run."""
    last = {}
    with open(os.path.join(build_dir, ".ninja_log")) as f:
        for line in f:
            if line.startswith("#"):
                continue
            start, end, _, output, *_ = line.rstrip("\n").split("\t")
            last[output] = (int(end) - int(start)) / 1000
    return sorted(((s, out) for out, s in last.items()), reverse=True)


def build(extra: list, install: bool, keep: str) -> dict:
    """One cold build into `keep` (emptied first): wall and CPU seconds."""
    shutil.rmtree(keep, ignore_errors=True)
    env = dict(os.environ, CCACHE_DISABLE="1")
    env.pop("PYTHONPATH", None)
    pip = [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory() as wheels:
        cmd = pip + (["install", "--force-reinstall", "--no-deps"] if install else
                     ["wheel", "--no-deps", "-w", wheels])
        cmd += ["--no-build-isolation", "--quiet", "--disable-pip-version-check",
                f"-Cbuild-dir={keep}", *extra, ROOT]
        load = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise SystemExit(f"install_time: the build failed: {' '.join(cmd)}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return dict(cmd=cmd, wall=wall, cpu=cpu, load=(load, os.getloadavg()[0]),
                steps=ninja_steps(keep))


def report(name: str, r: dict, top: int) -> None:
    compiles = [(s, o) for s, o in r["steps"] if o.endswith(".o")]
    kinds = collections.Counter()
    for s, o in r["steps"]:
        kinds["compile" if o.endswith(".o") else "pch" if ".gch" in o or ".pch" in o
              else "link and other"] += s
    print(f"\n{name}: wall {r['wall']:.0f} s, CPU {r['cpu']:.0f} s; {len(compiles)} translation "
          f"units; step seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in kinds.items())
          + f"; load average {r['load'][0]:.1f} before, {r['load'][1]:.1f} after")
    print(f"  {' '.join(r['cmd'][2:])}")
    print(f"  slowest steps (wall seconds each, {os.cpu_count()} jobs at once):")
    for s, o in r["steps"][:top]:
        print(f"    {s:6.1f}  {o}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                    help="another build with these extra pip arguments (space-separated)")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--install", action="store_true",
                    help="pip install into this Python's environment, not pip wheel")
    ap.add_argument("--keep", default=os.path.join(ROOT, "build-install-time"),
                    help="the build folder, emptied before each build and kept after")
    a = ap.parse_args(argv)
    import torch

    print(f"memfit install time: python {sys.version.split()[0]}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, CCACHE_DISABLE=1, a fresh build folder each time")
    runs = [("default", [])] + [(v.split("=", 1)[0], v.split("=", 1)[1].split())
                                for v in a.variant]
    results = {}
    for name, extra in runs:
        results[name] = build(extra, a.install, a.keep)
        report(name, results[name], a.top)
    base = results["default"]["wall"]
    print(f"\ndefault: {base:.0f} s ({base / 60:.1f} min; the goal is under 3 min)")
    for name in results:
        if name != "default":
            r = results[name]
            print(f"{name}: {r['wall']:.0f} s wall, {r['wall'] / base:.2f}x the default; "
                  f"CPU {r['cpu'] / results['default']['cpu']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
