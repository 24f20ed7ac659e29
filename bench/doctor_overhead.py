"""The cost of memfit.doctor: a training step inside `with memfit.doctor(model,
opt)` as a ratio to the same step outside it, timed interleaved in this
process (the machine's noise hits all columns alike), beside the step under
memfit.track() alone (the tracking allocator the doctor builds on), and the
one-off cost of the analysis when the block ends (the checks and the trials
that re-run a step), per step observed.

    PYTHONPATH=build/python .venv/bin/python bench/doctor_overhead.py [--quick]
"""

import argparse
import os
import statistics
import sys
import time

import torch

import memfit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import timed  # noqa: E402


def models():
    small = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    mlp = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 512), torch.nn.ReLU(),
                              torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(inplace=True),
        torch.nn.Conv2d(32, 64, 3, padding=1, stride=2), torch.nn.BatchNorm2d(64),
        torch.nn.ReLU(inplace=True), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(64, 10))
    enc = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), 2)
    ce, mse = torch.nn.functional.cross_entropy, torch.nn.functional.mse_loss
    return [
        ("small mlp, batch 16", small, torch.randn(16, 32), torch.randint(0, 4, (16,)), ce),
        ("mlp 784-512-512-10, batch 64", mlp, torch.randn(64, 28, 28),
         torch.randint(0, 10, (64,)), ce),
        ("cnn 3x32x32, batch 32", cnn, torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,)), ce),
        ("transformer encoder, batch 8x32", enc, torch.randn(8, 32, 64), torch.randn(8, 32, 64),
         mse),
    ]


def step(model, opt, x, y, loss_fn):
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    reps, n = (6, 10) if args.quick else (30, 10)
    print(f"torch {torch.__version__}, one thread, {reps} rounds of {n} steps, interleaved; "
          "ratios: median over rounds of each round's time over the plain round's before it")
    print(f"{'model':34} {'plain step':>11} {'track()':>8} {'doctor':>8} "
          f"{'analysis at exit':>18}")
    for name, model, x, y, loss_fn in models():
        opt = torch.optim.Adam(model.parameters())
        for _ in range(3):
            step(model, opt, x, y, loss_fn)
        plain, tracked, doctored, analysis = [], [], [], []
        for _ in range(reps):
            plain.append(timed(lambda: step(model, opt, x, y, loss_fn), n))
            with memfit.track():
                tracked.append(timed(lambda: step(model, opt, x, y, loss_fn), n))
            d = memfit.doctor(model, opt)
            d.__enter__()
            try:
                doctored.append(timed(lambda: step(model, opt, x, y, loss_fn), n))
            finally:
                t0 = time.perf_counter()
                d.__exit__(None, None, None)
                analysis.append((time.perf_counter() - t0) / n)
            assert not d.findings, d.report()
        p = statistics.median(plain)
        track_ratio = statistics.median(t / q for t, q in zip(tracked, plain))
        doctor_ratio = statistics.median(d / q for d, q in zip(doctored, plain))
        print(f"{name:34} {p * 1e3:9.2f}ms {track_ratio:7.2f}x {doctor_ratio:7.2f}x "
              f"{statistics.median(analysis) * 1e3:12.2f}ms/step")


if __name__ == "__main__":
    main()
