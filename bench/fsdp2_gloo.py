"""FSDP2 (torch.distributed.fsdp.fully_shard) on 2 CPU ranks with gloo,
measured, beside memfit's plan for it (report.data_parallel(2,
sharding="fsdp2", ...)) made from one single-process profile.

    PYTHONPATH=build/python .venv/bin/python bench/fsdp2_gloo.py [--quick] [--only NAME]

Models: an MLP (n x Linear(width, width)), memfit's GPT twin
(bench/_models.py) and a tiny HF Llama from a config (bench/_peer_models.py,
when transformers imports). Each runs plain, with mixed precision
(MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)) and with CPU
offload (CPUOffloadPolicy(pin_memory=False)): every block of the model's
chain and then the root wrapped with fully_shard, AdamW, two iterations,
the same batch on each rank. A rank's measured peak is its sharded
parameters' storage (made before the recording) plus the peak of its CPU
allocations during the two steps (memfit.track; the meta tensors DTensor
makes to propagate shardings are not memory and are left out). On a CPU
the device is the host: with offload the plan's device and host figures
are added to compare. The single process records in fp32, so the plan
keeps fp32 activations under mixed precision (high)."""

import argparse
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memfit.testing import models as _models  # noqa: E402
import memfit  # noqa: E402
from memfit.report.data_parallel import chain_blocks  # noqa: E402

WORLD = 2


def _mlp(layers, width):
    def make():
        return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])

    def batch(b):
        return torch.randn(b, width), torch.randn(b, width)

    return make, batch, torch.nn.functional.mse_loss


def cases(quick):
    """name -> (make model, make batch(b) -> (inputs, target), loss_fn, batch)."""
    out = {"mlp": (*_mlp(4, 256), 64) if quick else (*_mlp(6, 512), 64)}
    make, batch, loss = _models.MODELS["gpt"]
    out["gpt"] = (make, batch, loss, 2 if quick else 4)
    if not quick:
        import _peer_models

        specs, _ = _peer_models.hf_specs()
        if "hf-llama" in specs:
            s = specs["hf-llama"]
            out["hf-llama"] = (s.make_model, lambda b: (s.sample_x(b), s.sample_y(b)),
                               s.loss_fn, 4)
    return out


def variants():
    """name -> (fully_shard keywords, the same for memfit's plan)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return {
        "plain": ({}, {}),
        "bf16 mixed": (dict(mp_policy=mixed), dict(mixed_precision=mixed)),
        "cpu offload": (dict(offload_policy=CPUOffloadPolicy(pin_memory=False)),
                        dict(cpu_offload=True)),
    }


def loss_of(loss_fn, out, y):
    # Mixed precision hands back bf16 outputs; the loss is taken in fp32.
    if isinstance(out, torch.Tensor):
        out = out.float()
    elif hasattr(out, "logits"):
        out.logits = out.logits.float()
    return _models.loss_of(out, y, loss_fn)


def cpu_peak(timeline):
    """The most bytes of CPU allocations alive at once."""
    live = peak = 0
    for kind, nbytes, _id, device, *_ in timeline.events():
        if device != "cpu":
            continue
        live += nbytes if kind == "alloc" else -nbytes
        peak = max(peak, live)
    return peak


def storage_bytes(model):
    seen = {}
    for p in model.parameters():
        s = p.to_local().untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def rank_main(rank, init_file, out_dir, names, quick):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=WORLD)
    from torch.distributed.fsdp import fully_shard

    measured = {}
    all_cases = cases(quick)
    for name in names:
        make, make_batch, loss_fn, b = all_cases[name]
        for variant, (shard_kw, _) in variants().items():
            torch.manual_seed(0)
            model = make()
            for block in chain_blocks(model):
                fully_shard(block, **shard_kw)
            fully_shard(model, **shard_kw)
            opt = torch.optim.AdamW(model.parameters())
            torch.manual_seed(1)
            x, y = make_batch(b)
            with memfit.track() as t:
                for _ in range(2):
                    loss = loss_of(loss_fn, model(x), y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    del loss
            measured[f"{name}|{variant}"] = storage_bytes(model) + cpu_peak(t.timeline)
            del model, opt
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(measured, f)
    dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 4 x Linear(256) MLP and the GPT")
    ap.add_argument("--only", help="one model: mlp, gpt or hf-llama")
    a = ap.parse_args(argv)
    if not dist.is_available() or not dist.is_gloo_available():
        print("[fsdp2_gloo] torch.distributed with gloo is not available in this torch")
        return 0
    names = [a.only] if a.only else list(cases(a.quick))
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(rank_main, args=(os.path.join(d, "init"), d, names, a.quick),
                           nprocs=WORLD, start_method="spawn")
        ranks = [json.load(open(os.path.join(d, f"rank{r}.json"))) for r in range(WORLD)]

    print(f"torch {torch.__version__}, gloo, {WORLD} CPU ranks, AdamW, two iterations, "
          f"fully_shard on each block of the chain and the root")
    print("| model | batch per rank | run | one process | zero3 row | fsdp2 plan | "
          "measured (fullest rank) | fsdp2 / measured |")
    print("|---|---|---|---|---|---|---|---|")
    all_cases, worst_low, worst_high = cases(a.quick), 0.0, 0.0
    for name in names:
        make, make_batch, loss_fn, b = all_cases[name]
        torch.manual_seed(0)
        model = make()
        torch.manual_seed(1)
        x, y = make_batch(b)
        report = memfit.profile(model, x, y, loss_fn=loss_fn,
                                optimizer=torch.optim.AdamW(model.parameters()))
        zero3 = report.data_parallel(WORLD, sharding="zero3",
                                     largest_unit=max(chain_blocks(model) or [model],
                                                      key=memfit.report.data_parallel.unit_bytes))[0]
        for variant, (_, plan_kw) in variants().items():
            row = report.data_parallel(WORLD, sharding="fsdp2", model=model, **plan_kw)[0]
            # One memory on a CPU: the device's and the host's figures add.
            predicted = row.peak_bytes + row.host_bytes
            measured = max(r[f"{name}|{variant}"] for r in ranks)
            ratio = predicted / measured
            worst_low, worst_high = min(worst_low or ratio, ratio), max(worst_high, ratio)
            print(f"| {name} | {b} | {variant} | {memfit.format_bytes(report.peak_bytes)} | "
                  f"{memfit.format_bytes(zero3.peak_bytes)} | {memfit.format_bytes(predicted)}"
                  f"{' (host ' + memfit.format_bytes(row.host_bytes) + ')' if row.host_bytes else ''}"
                  f" | {memfit.format_bytes(measured)} | {ratio:.3f} |")
    print(f"\nfsdp2 plan / measured: lowest {worst_low:.3f}, highest {worst_high:.3f} "
          f"(never under 1.000 is the rule)")
    return 0 if worst_low >= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
