"""A card's budget planned on the CPU: find_batch_size in allocated bytes
(target_device="cpu") against the same search held against the CUDA caching
allocator's reserved bytes (target_device="cuda"). For each answer, what a
card would reserve for its step (memfit.profile(target_device="cuda") at
that batch: the caching allocator replayed on the recorded events) over the
budget: above 1.00 the step would not fit the card. No GPU is used; the
allocator's rules are the ones bench/gpu/compare_cuda.py checks on one.

    PYTHONPATH=build/python .venv/bin/python bench/cuda_target.py
        [--models mlp,cnn,gpt,lstm,resnet18-twin] [--budgets 40MiB,256MiB] [--true-max]

--true-max: also the largest batch whose replayed reserve fits, searched
(doubling from the answer, then bisecting: the reserve is a staircase, not
monotone, so this is the first batch above the answer that does not fit,
less one), and the answer over it.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memfit  # noqa: E402
from memfit.testing.models import make, loss_of  # noqa: E402


def reserved_at(model, x, y, loss_fn, batch):
    """What a card's caching allocator would reserve for the step at `batch`."""
    xb = x[:1].repeat(batch, *([1] * (x.dim() - 1)))
    yb = y[:1].repeat(batch, *([1] * (y.dim() - 1)))
    r = memfit.profile(model, xb, yb, loss_fn=lambda o, t: loss_of(o, t, loss_fn),
                       optimizer="adam", target_device="cuda")
    return r.cuda.peak_reserved


def first_failure(model, x, y, loss_fn, batch, budget):
    """The batch before the first one above `batch` (which fits) whose
    replayed reserve is over `budget`."""
    lo, hi = batch, batch * 2
    while reserved_at(model, x, y, loss_fn, hi) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if reserved_at(model, x, y, loss_fn, mid) <= budget else (lo, mid)
    return lo


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,cnn,gpt,lstm,resnet18-twin")
    ap.add_argument("--budgets", default="40MiB,256MiB")
    ap.add_argument("--true-max", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, Adam; reserved/budget above 1.00: the step "
          f"does not fit the card")
    print(f"{'model':<14} {'budget':>8} | {'cpu: batch':>10} {'reserved/budget':>15} | "
          f"{'cuda: batch':>11} {'reserved/budget':>15} {'trials':>6}")
    worst_cpu, worst_cuda = 0.0, 0.0
    for name in args.models.split(","):
        model, x, y, loss_fn = make(name, 8)
        lf = lambda o, t: loss_of(o, t, loss_fn)  # noqa: E731
        for text in args.budgets.split(","):
            row = [f"{name:<14} {text:>8} |"]
            for target in ("cpu", "cuda"):
                try:
                    f = memfit.find_batch_size(model, x, y, loss_fn=lf, optimizer="adam",
                                               budget=text, target_device=target)
                except memfit.DoesNotFit:
                    row.append(f"{'none fits':>{10 if target == 'cpu' else 11}} {'-':>15}")
                    if target == "cuda":
                        row.append(f"{'-':>6}")
                    continue
                ratio = reserved_at(model, x, y, loss_fn, f.max_batch) / f.budget_bytes
                if target == "cpu":
                    worst_cpu = max(worst_cpu, ratio)
                    row.append(f"{f.max_batch:>10} {ratio:>15.3f} |")
                else:
                    worst_cuda = max(worst_cuda, ratio)
                    row.append(f"{f.max_batch:>11} {ratio:>15.3f} {f.trials:>6}")
                    if args.true_max:
                        top = first_failure(model, x, y, loss_fn, f.max_batch, f.budget_bytes)
                        row.append(f"| true max {top}, found/true {f.max_batch / top:.3f}")
            print(" ".join(row), flush=True)
    print(f"worst reserved/budget: planned in allocated bytes {worst_cpu:.3f}, "
          f"held against reserved bytes {worst_cuda:.3f}")


if __name__ == "__main__":
    main()
