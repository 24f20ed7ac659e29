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

ap = argparse.ArgumentParser()
ap.add_argument("old")
ap.add_argument("new")
ap.add_argument("--only", help="only the commands whose text holds this")
args = ap.parse_args()
OLD, NEW = args.old, args.new
TIMEY = ("_ns", "ms", "time", "seconds", "ratio", "elapsed", "wall")  # what differs run to run
def strip(o):
    if isinstance(o, dict):
        return {k: strip(v) for k, v in o.items() if not any(t in k for t in TIMEY)}
    if isinstance(o, list):
        return [strip(v) for v in o]
    return o
cases=[]
ONLY = args.only
for m in ["mlp","cnn","gpt","lstm","resnet18"]:
    cases.append(["profile","--model",m,"--batch","8","--json"])
    cases.append(["profile","--model",m,"--batch","8","--json","--target","cuda"])
    cases.append(["profile","--model",m,"--batch","8","--json","--mode","meta"])
for m,b in [("mlp","16MiB"),("cnn","48MiB"),("gpt","64MiB"),("lstm","32MiB")]:
    cases.append(["fit","--model",m,"--budget",b,"--json"])
for m,b in [("mlp","8MiB"),("gpt","64MiB")]:
    cases.append(["advise","--model",m,"--batch","8","--budget",b,"--json","--repeats","0","--quiet"])
same=diff=0
for c in cases:
    if ONLY and ONLY not in " ".join(c): continue
    outs=[]
    for exe in (OLD,NEW):
        r=subprocess.run([exe]+c,capture_output=True,text=True,timeout=600)
        try: outs.append(strip(json.loads(r.stdout)))
        except Exception: outs.append(("rc",r.returncode,r.stdout[-200:],r.stderr[-300:]))
    ok = outs[0]==outs[1]
    same+=ok; diff+=not ok
    print("same" if ok else "DIFF", " ".join(c), flush=True)
    if not ok:
        a,b=outs
        if isinstance(a,dict) and isinstance(b,dict):
            for k in sorted(set(a)|set(b)):
                if a.get(k)!=b.get(k): print("   key", k, str(a.get(k))[:150], "|", str(b.get(k))[:150])
        else: print("  ", str(a)[:300], "\n  ", str(b)[:300])
print(f"{same} same, {diff} different")
