"""find_batch_size for a card, checked on the card: for each model, the batch
memfit fits under a budget (target_device="cuda": each step held against
the caching allocator's reserved bytes, replayed on its recorded events),
then real training steps at that batch on the GPU, and the card's own
max_memory_reserved over the budget (must be <= 1.00) and over memfit's
measured reserve (its error). The budget counts the model's weights: the
allocator starts empty (empty_cache) with the model and batch moved on.

    PYTHONPATH=build-gpu/python python bench/gpu/fit_on_card.py [--budgets 256MiB,1GiB]
        [--models mlp,cnn,gpt,lstm] [--dry-run]

--dry-run (or no GPU): the fits only, on the CPU, no real steps.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import memfit  # noqa: E402
from memfit.testing.models import loss_of, make  # noqa: E402


def real_reserved(model, x, y, loss_fn, steps=3):
    """The card's peak reserved bytes over `steps` Adam steps at x's batch."""
    opt = torch.optim.Adam(model.parameters())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        loss = loss_of(model(x), y, loss_fn)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_reserved()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,cnn,gpt,lstm")
    ap.add_argument("--budgets", default="256MiB,1GiB")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--json", help="write the rows here (default $OUT/gpu_fit_on_card.json)")
    args = ap.parse_args(argv)
    on_card = torch.cuda.is_available() and not args.dry_run
    where = "on " + torch.cuda.get_device_name(0) if on_card else "dry run: fits only"
    print(f"torch {torch.__version__}; {where}")
    print(f"{'model':<8} {'budget':>8} {'batch':>7} {'memfit reserved':>16} {'card reserved':>14} "
          f"{'card/budget':>11} {'card/memfit':>11}")
    rows, worst = [], 0.0
    for name in args.models.split(","):
        for text in args.budgets.split(","):
            model, x, y, loss_fn = make(name, 8)
            lf = lambda o, t, f=loss_fn: loss_of(o, t, f)  # noqa: E731
            if on_card:
                model, x, y = model.cuda(), x.cuda(), y.cuda()
                torch.cuda.empty_cache()
            try:
                fit = memfit.find_batch_size(model, x, y, loss_fn=lf, optimizer="adam",
                                             budget=text, target_device="cuda")
            except memfit.DoesNotFit as e:
                print(f"{name:<8} {text:>8}   none fits: {str(e)[:80]}")
                continue
            row = dict(model=name, budget=fit.budget_bytes, batch=fit.max_batch,
                       memfit_reserved=fit.measured_peak_bytes, card_reserved=None)
            if on_card:
                reps = [fit.max_batch] + [1] * (x.dim() - 1)
                xb, yb = x[:1].repeat(*reps), y[:1].repeat(fit.max_batch, *([1] * (y.dim() - 1)))
                del x, y
                torch.cuda.empty_cache()
                try:
                    row["card_reserved"] = real_reserved(model, xb, yb, loss_fn)
                except torch.cuda.OutOfMemoryError:
                    row["card_reserved"] = -1  # the card ran out: an overshoot
            rows.append(row)
            card = row["card_reserved"]
            if card is None:
                cells = f"{'-':>14} {'-':>11} {'-':>11}"
            elif card < 0:
                cells = f"{'OOM':>14} {'OOM':>11} {'-':>11}"
                worst = float("inf")
            else:
                worst = max(worst, card / fit.budget_bytes)
                cells = (f"{card:>14,} {card / fit.budget_bytes:>11.3f} "
                         f"{card / max(1, fit.measured_peak_bytes):>11.3f}")
            print(f"{name:<8} {text:>8} {fit.max_batch:>7} {fit.measured_peak_bytes:>16,} {cells}",
                  flush=True)
            del model
            if on_card:
                torch.cuda.empty_cache()
    if on_card:
        print(f"worst card reserved / budget: {worst:.3f} (above 1.000: memfit's fit overshot)")
    out = args.json or (os.path.join(os.environ["OUT"], "gpu_fit_on_card.json")
                        if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if on_card and worst > 1.0 else 0


if __name__ == "__main__":
    sys.exit(main())
