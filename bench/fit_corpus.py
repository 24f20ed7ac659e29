"""find_batch_size on a corpus of architectures it was not built with: the
found batch against the true maximum (bisection on measured steps), the
overshoots (must be 0), the full-size trials, the prediction at a large
batch against the measured peak, and fit's cost in plain steps at its answer
(a ratio of times measured in the same run). Run with 1 and 2 threads: CPU kernels pick
their path (and their workspace) by batch and by thread count.

    PYTHONPATH=build/python .venv/bin/python bench/fit_corpus.py [--quick]

torchvision and timm import only with the torch 2.14.1 CUDA wheel here (the
CPU 2.13.0 wheel has no torchvision::nms), so this corpus is what torch 2.13
runs: memfit's built-in twins, Hugging Face models from small configs (no
weights, no hub), and hand-written conv nets of the kinds that broke fits
(GroupNorm/SiLU, depthwise, residual).
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memfit  # noqa: E402
from _peer_models import Spec, _classes, fit_specs, hf_specs  # noqa: E402


class UNetish(nn.Module):
    """GroupNorm + SiLU conv blocks, down and up once, 32x32: the net whose
    per-sample memory changed with the batch (#15)."""

    def __init__(self, c=32):
        super().__init__()

        def block(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.GroupNorm(8, o), nn.SiLU(),
                                 nn.Conv2d(o, o, 3, padding=1), nn.GroupNorm(8, o), nn.SiLU())

        self.down, self.mid, self.up = block(3, c), block(c, 2 * c), block(3 * c, c)
        self.out = nn.Conv2d(c, 3, 1)

    def forward(self, x):
        d = self.down(x)
        m = self.mid(F.avg_pool2d(d, 2))
        u = F.interpolate(m, scale_factor=2.0)
        return self.out(self.up(torch.cat([u, d], 1)))


class Depthwise(nn.Module):
    """MobileNet-style depthwise-separable blocks with BatchNorm and ReLU6."""

    def __init__(self, c=32):
        super().__init__()
        layers = [nn.Conv2d(3, c, 3, stride=2, padding=1), nn.BatchNorm2d(c), nn.ReLU6()]
        for _ in range(3):
            layers += [nn.Conv2d(c, c, 3, padding=1, groups=c), nn.BatchNorm2d(c), nn.ReLU6(),
                       nn.Conv2d(c, 2 * c, 1), nn.BatchNorm2d(2 * c), nn.ReLU6()]
            c *= 2
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(c, 10)

    def forward(self, x):
        return self.head(self.body(x).mean((2, 3)))


class Residual(nn.Module):
    """Two ResNet basic blocks (BatchNorm, ReLU, skip), 32x32."""

    def __init__(self, c=32):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)

        def basic():
            return nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
                                 nn.ReLU(), nn.Conv2d(c, c, 3, padding=1, bias=False),
                                 nn.BatchNorm2d(c))

        self.b1, self.b2 = basic(), basic()
        self.head = nn.Linear(c, 10)

    def forward(self, x):
        h = self.stem(x)
        h = F.relu(h + self.b1(h))
        h = F.relu(h + self.b2(h))
        return self.head(h.mean((2, 3)))


def image(n):
    return torch.randn(n, 3, 32, 32)


def corpus(quick):
    specs = dict(fit_specs())
    specs["unet-gn-silu"] = Spec("unet-gn-silu", UNetish, image, image, F.mse_loss,
                                 note="GroupNorm+SiLU, 32x32")
    specs["depthwise"] = Spec("depthwise", Depthwise, image, _classes, note="MobileNet-style")
    specs["residual"] = Spec("residual", Residual, image, _classes, note="2 basic blocks")
    if not quick:
        hf, _ = hf_specs(seq=32)
        specs.update(hf)
    return specs


def measure(spec, threads, budget_batch):
    torch.set_num_threads(threads)
    model = spec.model()
    x, y = spec.batch(8)
    report = memfit.profile(model, x, y, loss_fn=spec.loss, optimizer="adam")
    budget = report.at_batch(budget_batch).peak_bytes  # a budget near budget_batch
    t0 = time.perf_counter()
    fit = memfit.find_batch_size(model, x, y, loss_fn=spec.loss, optimizer="adam", budget=budget)
    fit_s = time.perf_counter() - t0
    cache = {}

    def peak(b):
        if b not in cache:
            cache[b] = report.at_batch(b).peak_bytes
        return cache[b]

    lo, hi = max(1, fit.max_batch), 2 * budget_batch
    while peak(hi) <= budget:
        lo, hi = hi, 2 * hi
    if peak(lo) > budget:
        lo = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if peak(mid) <= budget else (lo, mid)
    large = 2 * budget_batch
    predicted = report.predict_peak_bytes(large)
    return dict(found=fit.max_batch, truth=lo, overshoot=peak(fit.max_batch) > budget,
                trials=fit.trials, affine=fit.affine,
                cost=fit_s / plain_step_seconds(spec, fit.max_batch),
                pred_err=(predicted - peak(large)) / peak(large))


def plain_step_seconds(spec, batch):
    """One plain training step at `batch` (forward, loss, backward, Adam,
    zero_grad), untracked: the unit of fit's planning cost. Best of 3."""
    model = spec.model(seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = spec.batch(batch)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        spec.loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    budget_batch = 48 if args.quick else 96
    rows = []
    print(f"{'model':<14} thr {'found':>6} {'true':>6} {'ratio':>6} over trials affine "
          f"{'pred@' + str(2 * budget_batch):>9} {'cost':>6}")
    for name, spec in corpus(args.quick).items():
        for threads in ((1,) if args.quick else (1, 2)):
            r = measure(spec, threads, budget_batch)
            rows.append((name, threads, r))
            print(f"{name:<14} {threads:>3} {r['found']:>6} {r['truth']:>6} "
                  f"{r['found'] / r['truth']:>6.3f} {'YES' if r['overshoot'] else 'no':>4} "
                  f"{r['trials']:>6} {str(r['affine']):>6} {100 * r['pred_err']:>+8.2f}% "
                  f"{r['cost']:>5.1f}x", flush=True)
    ratios = [r["found"] / r["truth"] for _, _, r in rows]
    errs = [abs(r["pred_err"]) for _, _, r in rows]
    worst = max(rows, key=lambda row: abs(row[2]["pred_err"]))
    print(f"\n{len(rows)} fits: overshoots {sum(r['overshoot'] for _, _, r in rows)}, "
          f"mean found/true {statistics.mean(ratios):.4f} (min {min(ratios):.4f}), "
          f"median |prediction error| at batch {2 * budget_batch} "
          f"{100 * statistics.median(errs):.2f}%, worst {100 * abs(worst[2]['pred_err']):.2f}% "
          f"({worst[0]}, {worst[1]} thread(s)); fit's cost, median "
          f"{statistics.median(r['cost'] for _, _, r in rows):.1f} plain steps at its answer "
          f"(its probes, the first profile at the example batch, and the verifying steps)")
    return 1 if any(r["overshoot"] for _, _, r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
