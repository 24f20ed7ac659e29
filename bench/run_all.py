"""Runs every benchmark: each bench/*.py script (not run_all.py, nor files
starting with '_'), then the C++ benchmark binaries found in the build folder
(built with -DMEMFIT_BUILD_BENCHMARKS=ON).

    PYTHONPATH=build/python .venv/bin/python bench/run_all.py --build build [--quick]

Scripts get --quick when it is given (every bench script must accept it) and
find the build folder in MEMFIT_BUILD. Exits non-zero if any benchmark failed.
"""

import argparse
import glob
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def scripts():
    found = []
    for path in sorted(glob.glob(os.path.join(HERE, "*.py"))):
        name = os.path.basename(path)
        if name.startswith("_") or name == os.path.basename(__file__):
            continue
        found.append(path)
    return found


def binaries(build):
    found = []
    for path in sorted(glob.glob(os.path.join(build, "bench", "**", "memfit_*bench*"), recursive=True)):
        if os.path.isfile(path) and os.access(path, os.X_OK):
            found.append(path)
    return found


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get("MEMFIT_BUILD", "build"),
                    help="build folder (default: build)")
    ap.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    ap.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = ap.parse_args(argv)

    build = os.path.abspath(args.build)
    env = dict(os.environ, MEMFIT_BUILD=build)
    py_dir = os.path.join(build, "python")
    path = env.get("PYTHONPATH", "")
    if os.path.isdir(py_dir) and py_dir not in path.split(os.pathsep):
        env["PYTHONPATH"] = py_dir + (os.pathsep + path if path else "")

    jobs = [[sys.executable, s] + (["--quick"] if args.quick else []) for s in scripts()]
    for b in binaries(build):
        # google/benchmark: a short minimum time per benchmark in quick runs.
        jobs.append([b] + (["--benchmark_min_time=0.01"] if args.quick else []))
    if args.list:
        for j in jobs:
            print(" ".join(j))
        return 0

    results = []
    for cmd in jobs:
        label = os.path.relpath(cmd[1] if cmd[0] == sys.executable else cmd[0])
        print(f"==> {label}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call(cmd, env=env)
        results.append((label, rc, time.perf_counter() - t0))
        print(flush=True)

    print("==> summary")
    for label, rc, seconds in results:
        print(f"  {'ok  ' if rc == 0 else 'FAIL'}  {label}  ({seconds:.1f} s)")
    return 0 if all(rc == 0 for _, rc, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
