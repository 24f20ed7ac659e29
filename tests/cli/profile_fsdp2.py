"""`memfit profile --world-size W --fsdp2`: torch's fully_shard row beside
the ZeRO rows, built from the model's chain (gpt: a unit per block, the
root owning the embeddings, the last norm and the head), and bad input
refused in one line.

    profile_fsdp2.py MEMFIT_BINARY"""

import json
import subprocess
import sys

MEMFIT = sys.argv[1]
W = 2
BASE = ["profile", "--model", "gpt", "--batch", "4", "--layers", "2", "--width", "128",
        "--context", "64", "--quiet", "--world-size", str(W)]


def run(*flags):
    return subprocess.run([MEMFIT, *BASE, *flags], capture_output=True, text=True, timeout=240)


def rows(*flags):
    done = run("--json", *flags)
    assert done.returncode == 0, (flags, done.stderr)
    report = json.loads(done.stdout)
    return report, {r["sharding"]: r for r in report["data_parallel"]["per_rank"]}


def refused(flags, message):
    done = run(*flags)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and message in lines[0], (flags, done.stderr)


report, plain = rows("--fsdp2")
assert list(plain) == ["ddp", "zero1", "zero2", "zero3", "fsdp2"], list(plain)
fsdp2 = plain["fsdp2"]
parameters = report["categories_at_peak"]["parameter"]
# Sharding saves more than the gathered units cost on this model, and a
# rank holds at least its shard of the parameters.
assert parameters // W < fsdp2["peak_bytes"] < plain["ddp"]["peak_bytes"], (fsdp2, plain["ddp"])
assert fsdp2["host_bytes"] == 0 and "Note [One rank's memory under FSDP2]" in fsdp2["formula"]
# Without --fsdp2 the four ZeRO rows alone, the same bytes.
_, zero = rows()
assert list(zero) == ["ddp", "zero1", "zero2", "zero3"]
assert all(zero[s]["peak_bytes"] == plain[s]["peak_bytes"] for s in zero)

# bf16 parameters gathered and whole gradients: fewer bytes.
_, mixed = rows("--fsdp2", "--param-dtype", "bf16", "--reduce-dtype", "fp32")
assert mixed["fsdp2"]["peak_bytes"] < fsdp2["peak_bytes"], (mixed["fsdp2"], fsdp2)

# CPU offload: the sharded state on the host, its own column in the table.
_, offload = rows("--fsdp2", "--cpu-offload")
assert offload["fsdp2"]["peak_bytes"] < fsdp2["peak_bytes"] and offload["fsdp2"]["host_bytes"] > 0
table = run("--fsdp2", "--cpu-offload")
assert table.returncode == 0, table.stderr
header = next(line for line in table.stdout.splitlines() if line.startswith("sharding"))
assert header.split()[:3] == ["sharding", "peak", "host"], header
assert any(line.startswith("fsdp2 ") for line in table.stdout.splitlines()), table.stdout

refused(["--fsdp2", "--param-dtype", "fp8"], "--param-dtype must be one of bf16, fp16, fp32")
refused(["--cpu-offload"], "--cpu-offload is an FSDP2 policy: give it with --fsdp2")
refused(["--reduce-dtype", "bf16"], "--reduce-dtype is an FSDP2 policy")
done = subprocess.run([MEMFIT, "profile", "--model", "gpt", "--fsdp2"], capture_output=True,
                      text=True, timeout=60)
assert done.returncode == 1 and "--fsdp2 needs --world-size W" in done.stderr, done.stderr
print("ok: fsdp2", fsdp2["peak_bytes"], "ddp", plain["ddp"]["peak_bytes"], "bf16",
      mixed["fsdp2"]["peak_bytes"], "offload", offload["fsdp2"]["peak_bytes"], "+ host",
      offload["fsdp2"]["host_bytes"])
