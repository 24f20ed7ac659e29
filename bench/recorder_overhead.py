"""The cost of watching: one training step under memfit.track() (tracking
allocators, RecordFunction op frames, the timeline) and under a simulated
device, each as a ratio to the same step untracked, timed interleaved in
this process.

    PYTHONPATH=build/python .venv/bin/python bench/recorder_overhead.py [--quick]
"""

import argparse
import os
import statistics
import sys

import torch

import memfit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import timed  # noqa: E402


def models():
    mlp = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 512), torch.nn.ReLU(),
                              torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    small = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), 2)
    return [
        ("small mlp, batch 16", small, torch.randn(16, 32), torch.randint(0, 4, (16,)), torch.nn.functional.cross_entropy),
        ("mlp 784-512-512-10, batch 64", mlp, torch.randn(64, 28, 28), torch.randint(0, 10, (64,)), torch.nn.functional.cross_entropy),
        ("transformer encoder, batch 8x32", enc, torch.randn(8, 32, 64), torch.randn(8, 32, 64), torch.nn.functional.mse_loss),
    ]


def step(model, opt, x, y, loss_fn):
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    reps, n = (5, 10) if args.quick else (15, 30)
    print(f"{'model':34} {'plain step':>11} {'track()':>9} {'simulated':>10}")
    for name, model, x, y, loss_fn in models():
        opt = torch.optim.Adam(model.parameters())
        for _ in range(3):
            step(model, opt, x, y, loss_fn)
        plain, tracked, budgeted = [], [], []
        for _ in range(reps):  # interleaved: the machine's noise hits all three
            plain.append(timed(lambda: step(model, opt, x, y, loss_fn), n))
            with memfit.track():
                tracked.append(timed(lambda: step(model, opt, x, y, loss_fn), n))
            with memfit.simulated_device("64GiB"):
                budgeted.append(timed(lambda: step(model, opt, x, y, loss_fn), n))
        p = statistics.median(plain)
        print(f"{name:34} {p * 1e3:9.2f}ms {statistics.median(tracked) / p:8.2f}x "
              f"{statistics.median(budgeted) / p:9.2f}x")


if __name__ == "__main__":
    main()
