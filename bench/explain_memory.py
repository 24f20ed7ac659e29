"""Host memory and time of `memfit explain` on a large synthetic CUDA memory
snapshot (a training loop's trace with Python and C++ frames on every entry,
written in torch's format by python/tests/snapshot_fixtures.py, streamed so
the file never exists in memory), against pickle.load of a smaller file of
the same kind measured in the same run.

    python3 bench/explain_memory.py [--size 1GiB] [--baseline-size 64MiB] [--dir /tmp]
    python3 bench/explain_memory.py --quick     # 128 MiB against 16 MiB

Each measurement runs in a fresh process; RSS is its ru_maxrss minus what
`import memfit` alone holds. The issue's bound: 1 GB read in under 2 GiB.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))

MEASURE = r"""
import json, resource, sys, time
def rss(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
what, path = sys.argv[1], sys.argv[2]
if what == "memfit":
    import memfit
    base = rss(); t0 = time.time()
    s = memfit.load_snapshot(path)
    read = time.time() - t0
    d = s.as_dict(); table = s.table()
    out = dict(base=base, rss=rss(), read_s=read, total_s=time.time() - t0,
               events=len(s.timeline), entries=s.trace_entries,
               peak_allocated=s.peak_allocated_bytes, peak_reserved=s.peak_reserved_bytes,
               replay=s.replay().status, replay_matches=s.replay().matches)
else:
    import pickle
    base = rss(); t0 = time.time()
    with open(path, "rb") as f:
        data = pickle.load(f)
    out = dict(base=base, rss=rss(), read_s=time.time() - t0, total_s=time.time() - t0,
               entries=len(data["device_traces"][0]))
print(json.dumps(out))
"""


def measure(what, path, env):
    r = subprocess.run([sys.executable, "-c", MEASURE, what, path], capture_output=True,
                       text=True, env=env)
    if r.returncode:
        raise SystemExit(f"explain_memory: {what} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def ensure(path, size):
    import snapshot_fixtures as fx

    if os.path.exists(path) and abs(os.path.getsize(path) - size) < size // 50:
        return None
    t0 = time.time()
    written = fx.write_streamed_snapshot(path, size)
    written["write_s"] = round(time.time() - t0, 1)
    return written


def parse(size):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if size.endswith(u):
            return int(float(size[: -len(u)]) * m)
    return int(size)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--baseline-size", default="64MiB")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("--quick", action="store_true", help="128 MiB against 16 MiB")
    args = ap.parse_args()
    if args.quick:
        args.size, args.baseline_size = "128MiB", "16MiB"
    env = dict(os.environ)
    build = os.environ.get("MEMFIT_BUILD", os.path.join(ROOT, "build"))
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(build, "python")] + env.get("PYTHONPATH", "").split(os.pathsep))
    big = os.path.join(args.dir, "memfit_explain_big_synthetic.pickle")
    small = os.path.join(args.dir, "memfit_explain_baseline_synthetic.pickle")
    for path, size in ((big, parse(args.size)), (small, parse(args.baseline_size))):
        w = ensure(path, size)
        if w:
            print(f"wrote {path}: {w['bytes']} bytes, {w['events']} trace entries "
                  f"({w['write_s']} s)", flush=True)
    m = measure("memfit", big, env)
    p = measure("pickle", small, env)
    mb = os.path.getsize(big)
    pb = os.path.getsize(small)
    grown = m["rss"] - m["base"]
    per_byte_pickle = (p["rss"] - p["base"]) / pb
    gib = 1 << 30
    print(f"memfit explain, {mb / gib:.2f} GiB snapshot ({m['entries']} entries, "
          f"{m['events']} events): RSS +{grown / gib:.2f} GiB ({grown / mb:.2f} bytes per file "
          f"byte), read {m['read_s']:.1f} s, explained {m['total_s']:.1f} s; peak allocated "
          f"{m['peak_allocated']}, reserved {m['peak_reserved']}; replay {m['replay']}"
          f"{' (matches)' if m['replay_matches'] else ''}")
    print(f"pickle.load, {pb / (1 << 20):.0f} MiB file of the same kind: RSS "
          f"+{(p['rss'] - p['base']) / (1 << 20):.0f} MiB ({per_byte_pickle:.2f} bytes per file "
          f"byte, {per_byte_pickle * mb / gib:.1f} GiB for the big file), {p['read_s']:.1f} s")
    print(f"ratio: memfit holds {grown / mb / per_byte_pickle:.3f}x the memory pickle.load "
          f"would; bound 2 GiB for 1 GB: {'met' if grown < 2 * gib else 'NOT met'}")
    if not args.keep:
        for path in (big, small):
            os.remove(path)


if __name__ == "__main__":
    main()
