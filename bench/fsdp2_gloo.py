"""FSDP2 (torch.distributed.fsdp.fully_shard) on 2 CPU ranks with gloo,
measured, beside memfit's per-rank plan (Report.data_parallel's ZeRO rows)
made from one process.

    PYTHONPATH=build/python .venv/bin/python bench/fsdp2_gloo.py [--quick]

The model: n x Linear(width, width), each layer and the whole wrapped with
fully_shard, AdamW, MSE, two iterations, the same batch on each rank. The
measured rank peak is the rank's sharded parameters (made before the
recording) plus the peak of every CPU allocation during the two steps
(memfit.track: gathered parameters, sharded gradients and state,
activations, gloo's buffers)."""

import argparse
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import memfit


def make(layers, width):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def batch(batch_size, width):
    g = torch.Generator().manual_seed(1)
    return torch.randn(batch_size, width, generator=g), torch.randn(batch_size, width, generator=g)


def rank_main(rank, world, port, layers, width, batch_size, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.fsdp import fully_shard

    model = make(layers, width)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters())
    shard = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    x, y = batch(batch_size, width)
    with memfit.track() as t:
        for _ in range(2):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss
    with open(f"{out}.{rank}", "w") as f:
        json.dump(dict(shard=shard, peak=shard + t.peak_bytes), f)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 layers of 256")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args(argv)
    if a.quick:
        a.layers, a.width = 4, 256
    if not dist.is_available() or not dist.is_gloo_available():
        print("[fsdp2_gloo] torch.distributed with gloo is not available in this torch")
        return 0
    out = f"/tmp/memfit-fsdp2-{os.getpid()}"
    mp.spawn(rank_main, args=(2, free_port(), a.layers, a.width, a.batch, out), nprocs=2)
    ranks = []
    for r in range(2):
        with open(f"{out}.{r}") as f:
            ranks.append(json.load(f))
        os.remove(f"{out}.{r}")
    measured = max(r["peak"] for r in ranks)

    model = make(a.layers, a.width)
    x, y = batch(a.batch, a.width)
    report = memfit.profile(model, x, y, optimizer=torch.optim.AdamW(model.parameters()))
    rows = report.data_parallel(2, largest_unit=model[0])
    print(f"torch {torch.__version__}, gloo, 2 CPU ranks, {a.layers} x Linear({a.width}), "
          f"batch {a.batch} per rank, AdamW, two iterations")
    print(f"measured FSDP2 rank peak: {measured:,} B ({memfit.format_bytes(measured)}); "
          f"one process, no sharding: {report.peak_bytes:,} B")
    print("| memfit plan | rank peak | vs measured FSDP2 |")
    print("|---|---|---|")
    for row in rows:
        print(f"| {row.sharding} | {row.peak_bytes:,} B | {row.peak_bytes / measured - 1:+.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
