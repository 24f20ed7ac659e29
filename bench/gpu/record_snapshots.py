"""Records CUDA memory snapshots of small training steps on a GPU: the
fixtures tests/data/snapshots/ holds, against which CI checks memfit's
allocator replay and its CPU-made prediction of the same steps.

Each case runs in a fresh process, with torch.cuda.memory's history on
before the first CUDA allocation (so the trace is complete): the model moved
to the card, then two iterations of memfit's step order (inputs, forward,
loss, backward, optimizer step, zero_grad(set_to_none=True); the output is
dropped once the loss exists), then _snapshot(). Beside each
CASE.pickle goes CASE.json: the card (name, capability, memory, driver),
torch, CUDA, cuDNN, the step, torch's own max_memory_allocated/reserved, and
for the built-in models the recipe of memfit's prediction
(`memfit explain CASE.pickle --predict --model M --batch B`).

Frames are recorded for Python only (stacks="python"; C++ symbolization takes
minutes) and for frees too (context="all"). Before the pickle is written,
equal frames and equal stacks are made one object each: pickle then writes
each once and refers back, so the file is a fraction of its size and reads
back equal (pickle.load gives the same dicts). Each file must stay under
2 MiB.

    python3 bench/gpu/record_snapshots.py --out DIR [--only mlp,gpt] [--dry-run]

--dry-run (no GPU needed): builds every case's model and batch on the CPU,
runs one step there, writes a synthetic snapshot through the same writer,
and says what it would record.
"""

import argparse
import datetime
import importlib.util
import json
import os
import pickle
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _testing_models():
    """memfit's Python twins of its built-in models, by file, not through
    `import memfit`: recording needs torch alone (as compare_cuda.py)."""
    spec = importlib.util.spec_from_file_location(
        "memfit_testing_models", os.path.join(ROOT, "python", "memfit", "testing", "models.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

MAX_BYTES = 2 << 20
ITERATIONS = 2


# name -> the step: model, batch size, optimizer, allocator settings; "predict"
# names memfit's built-in model of the same step, when there is one.
CASES = {
    "mlp_adam": dict(model="mlp", batch=64, predict="mlp"),
    "mlp_adam_expandable": dict(model="mlp", batch=64, expandable=True),
    "gpt_adam": dict(model="gpt", batch=4, predict="gpt"),
    "gpt_adam_expandable": dict(model="gpt", batch=4, expandable=True),
    "cnn_adam": dict(model="cnn", batch=32, predict="cnn"),
    "resnet18_adam": dict(model="resnet18", batch=16, predict="resnet18"),
    "llama_tiny_adam": dict(model="llama", batch=4),
    # The gpt at a batch that does not fit a 160 MiB cap: ends in an OOM.
    "gpt_oom": dict(model="gpt", batch=64, cap_bytes=160 << 20),
    # Recorded only when --only names them: the batches find_batch_size chose
    # for a card (bench/gpu/fit_on_card.py) where the card reserved more than
    # the budget, to see on the trace where the bytes memfit missed went.
    "cnn_fit_256MiB": dict(model="cnn", batch=144, predict="cnn", extra=True),
    "cnn_fit_1GiB": dict(model="cnn", batch=592, predict="cnn", extra=True),
    "mlp_fit_256MiB": dict(model="mlp", batch=19699, predict="mlp", extra=True),
    "gpt_fit_256MiB": dict(model="gpt", batch=13, predict="gpt", extra=True),
    "resnet18_b128": dict(model="resnet18", batch=128, predict="resnet18", extra=True),
}

LLAMA = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
LLAMA_SEQ = 128


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# --- the steps ---------------------------------------------------------------

def build(case):
    """(model, make_batch(device) -> (x, y), loss_fn, kwargs for the call)
    for `case`, on the CPU."""
    import torch
    import torch.nn.functional as F

    _models = _testing_models()
    name, b = case["model"], case["batch"]
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(**LLAMA))

        def batch(device):
            ids = torch.randint(0, LLAMA["vocab_size"], (b, LLAMA_SEQ)).to(device)
            return ids, ids

        def loss_fn(out, y):
            return out.loss

        return model, batch, loss_fn, True
    if name == "gpt":
        model = _models.Gpt()

        def batch(device):
            # As memfit's built-in gpt makes it (src/torch/models.cpp).
            ids = torch.randint(0, 1024, (b, 129))
            return (ids[:, :128].contiguous().to(device), ids[:, 1:].contiguous().to(device))

        return model, batch, _models.gpt_loss, False
    if name == "resnet18":
        # torchvision's where it imports; else the twin of its layout.
        model = _models.make("resnet18" if _models.available("resnet18") else
                             "resnet18-twin", 1)[0]
        size = 64
    elif name == "cnn":
        model, size = _models.Cnn(), 32
    else:
        model, size = _models.Mlp(), None

    def batch(device):
        x = torch.randn(b, 28, 28) if size is None else torch.randn(b, 3, size, size)
        return x.to(device), torch.randint(0, 10, (b,)).to(device)

    return model, batch, F.cross_entropy, False


def run_step(case, device, iterations=ITERATIONS):
    """memfit's step order (src/core/step_protocol.cpp) on `device`; returns
    whether it ran out of memory."""
    import torch

    model, batch, loss_fn, hf = build(case)
    model.to(device)
    # LibTorch's Adam is per-parameter: foreach=False is the same algorithm.
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    try:
        for _ in range(iterations):
            x, y = batch(device)
            out = model(x, labels=y) if hf else model(x)
            loss = loss_fn(out, y)
            out = None  # noqa: F841  (dropped once the loss exists, as memfit's step)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            x = y = loss = None  # noqa: F841
    except torch.cuda.OutOfMemoryError:
        return True
    return False


# --- the snapshot ------------------------------------------------------------

def shared(snapshot):
    """`snapshot` with equal frames and equal stacks made one object each
    (See the module's docstring): the same data, written once each."""
    frames, stacks = {}, {}

    def stack(fs):
        key = tuple((f.get("filename"), f.get("line"), f.get("name")) for f in fs)
        hit = stacks.get(key)
        if hit is None:
            hit = stacks[key] = [frames.setdefault(k, f) for k, f in zip(key, fs)]
        return hit

    for seg in snapshot.get("segments", []):
        if "frames" in seg:
            seg["frames"] = stack(seg["frames"])
        for blk in seg.get("blocks", []):
            if "frames" in blk:
                blk["frames"] = stack(blk["frames"])
    for trace in snapshot.get("device_traces", []):
        for e in trace:
            if "frames" in e:
                e["frames"] = stack(e["frames"])
    return snapshot


def write(snapshot, path):
    with open(path, "wb") as f:
        pickle.dump(shared(snapshot), f)
    return os.path.getsize(path)


def machine():
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": None, "gpu": None,
            "recorded": datetime.date.today().isoformat()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, capability="sm_%d%d" % torch.cuda.get_device_capability(0),
                    total_memory=p.total_memory, cudnn=torch.backends.cudnn.version())
        try:
            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            info["driver"] = None
    return info


def record_one(name, out_dir):
    """In this (fresh) process: record case `name` into out_dir."""
    import torch

    case = CASES[name]
    if case.get("cap_bytes"):
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(case["cap_bytes"] / total)
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                             max_entries=1_000_000)
    t0 = time.time()
    try:
        oom = run_step(case, "cuda")
    except ImportError as e:  # transformers missing on this machine
        torch.cuda.memory._record_memory_history(enabled=None)
        log(f"record_snapshots: {name} skipped: {e}")
        return 0
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    path = os.path.join(out_dir, name + ".pickle")
    size = write(snapshot, path)
    meta = dict(machine(), case=name, model=case["model"], batch=case["batch"],
                optimizer="adam (foreach=False)", iterations=ITERATIONS,
                expandable_segments=bool(case.get("expandable")), oom=oom,
                cap_bytes=case.get("cap_bytes"), synthetic=False,
                max_memory_allocated=torch.cuda.max_memory_allocated(),
                max_memory_reserved=torch.cuda.max_memory_reserved(),
                trace_entries=sum(len(t) for t in snapshot["device_traces"]),
                file_bytes=size, seconds=round(time.time() - t0, 2),
                frames="Python frames (stacks='python', context='all'); equal frames "
                       "and stacks shared in the pickle")
    if case["model"] == "llama":
        meta["llama_config"] = LLAMA
        meta["sequence"] = LLAMA_SEQ
    if case.get("predict") and not case.get("expandable") and not oom:
        meta["predict"] = {"model": case["predict"], "batch": case["batch"],
                           "optimizer": "adam", "iterations": ITERATIONS}
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(meta, f, indent=2)
    print(json.dumps({k: meta[k] for k in ("case", "trace_entries", "file_bytes", "oom",
                                            "max_memory_allocated", "max_memory_reserved")}))
    if size > MAX_BYTES:
        log(f"record_snapshots: {name}.pickle is {size} bytes, over {MAX_BYTES}")
        return 3
    return 0


def dry_run(names, out_dir):
    """Everything but the GPU: each case's model and batch built and one
    step run on the CPU; the writer run on a synthetic snapshot."""
    import torch

    for name in names:
        case = dict(CASES[name], batch=2)
        t0 = time.time()
        run_step(case, "cpu", iterations=1)
        log(f"dry run: {name}: model {case['model']} built, one step on the CPU "
            f"({time.time() - t0:.1f} s); would record batch {CASES[name]['batch']}"
            f"{', expandable_segments' if CASES[name].get('expandable') else ''}"
            f"{', capped at %d MiB (OOM)' % (CASES[name]['cap_bytes'] >> 20) if CASES[name].get('cap_bytes') else ''}")
    frame = lambda i: {"filename": "/x/model.py", "line": i, "name": "forward"}  # noqa: E731
    fake = {"segments": [{"address": 0, "total_size": 2 << 20, "blocks": [
        {"address": 0, "size": 512, "requested_size": 4, "state": "active_allocated",
         "frames": [frame(1), frame(2)]}]}],
        "device_traces": [[{"action": "alloc", "addr": 0, "size": 4, "stream": 0,
                            "time_us": 1, "frames": [frame(1), frame(2)]}] * 3]}
    want = pickle.loads(pickle.dumps(fake))
    path = os.path.join(out_dir, "dry_run_synthetic.pickle")
    size = write(fake, path)
    with open(path, "rb") as f:
        assert pickle.load(f) == want, "the shared frames changed the snapshot"
    os.remove(path)
    log(f"dry run: the writer keeps a snapshot equal ({size} bytes); torch "
        f"{torch.__version__}, CUDA available: {torch.cuda.is_available()}")
    print(json.dumps({"dry_run": True, "cases": names, "out": out_dir}))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the folder the snapshots go to")
    ap.add_argument("--only", help="cases, comma separated: " + ",".join(CASES))
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--case", help=argparse.SUPPRESS)  # internal: one case, this process
    ap.add_argument("--timeout", type=int, default=120, help="seconds per case")
    args = ap.parse_args()
    names = ([n for n in CASES if not CASES[n].get("extra")] if not args.only
             else args.only.split(","))
    unknown = [n for n in names if n not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {','.join(unknown)}: the cases are {','.join(CASES)}")
    os.makedirs(args.out, exist_ok=True)
    if args.case:
        return record_one(args.case, args.out)
    if args.dry_run:
        return dry_run(names, args.out)
    import torch

    if not torch.cuda.is_available():
        log("record_snapshots: no CUDA device visible to torch; --dry-run checks the rest")
        return 1
    rc = 0
    for name in names:
        env = dict(os.environ)
        if CASES[name].get("expandable"):
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        else:
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        log(f"record_snapshots: {name}")
        try:
            r = subprocess.run([sys.executable, __file__, "--out", args.out, "--case", name],
                               env=env, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            log(f"record_snapshots: {name} took over {args.timeout} s")
            r = 124
        rc = rc or r
    return rc


if __name__ == "__main__":
    sys.exit(main())
