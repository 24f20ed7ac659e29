"""find_batch_size for a card, checked on the card: for each model, the batch
memfit fits under a budget (target_device="cuda": each step held against
the caching allocator's reserved bytes, replayed on its recorded events),
then real training steps at that batch on the GPU, twice:

- capped: in a fresh process whose caching allocator may reserve no more
  than the budget (torch.cuda.set_per_process_memory_fraction), as on a
  card of that size: it must run without an OOM. This is the verdict.
  Kernels whose workspace is elastic (cuDNN's convolutions try their
  algorithms in turn and take the next when a workspace does not fit) adapt
  here as they would on that card;
- free: on the whole card, the card's max_memory_reserved over the budget
  and over memfit's measured reserve: what the step takes when memory is
  plentiful (more than the budget where a kernel grows into free memory).

The budget counts the model's weights: the allocator starts empty
(empty_cache) with the model and batch moved on.

    PYTHONPATH=build-gpu/python python bench/gpu/fit_on_card.py [--budgets 256MiB,1GiB]
        [--models mlp,cnn,gpt,lstm] [--dry-run]

--dry-run (or no GPU): the fits only, on the CPU, no real steps.
"""

import argparse
import json
import os
import subprocess
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


def capped_one(name, batch, budget):
    """In this fresh process: `batch` of model `name`, 3 Adam steps with the
    caching allocator capped at `budget` bytes. Prints a JSON line."""
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(budget / total)
    model, x, y, loss_fn = make(name, batch)
    result = dict(oom=False)
    try:
        model, x, y = model.cuda(), x.cuda(), y.cuda()
        real_reserved(model, x, y, loss_fn)
    except torch.cuda.OutOfMemoryError as e:
        result.update(oom=True, message=str(e).splitlines()[0][:240])
    result.update(max_reserved=torch.cuda.max_memory_reserved(),
                  max_allocated=torch.cuda.max_memory_allocated())
    print(json.dumps(result))
    return 0


def run_capped(name, batch, budget):
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--capped-one", name,
                           str(batch), str(budget)], capture_output=True, text=True, timeout=180)
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    if not lines:
        return dict(oom=None, message=f"exit {done.returncode}: {done.stderr.strip()[-240:]}")
    return json.loads(lines[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,cnn,gpt,lstm")
    ap.add_argument("--budgets", default="256MiB,1GiB")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--json", help="write the rows here (default $OUT/gpu_fit_on_card.json)")
    ap.add_argument("--capped-one", nargs=3, metavar=("MODEL", "BATCH", "BUDGET"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.capped_one:
        name, batch, budget = args.capped_one
        return capped_one(name, int(batch), int(budget))
    on_card = torch.cuda.is_available() and not args.dry_run
    where = "on " + torch.cuda.get_device_name(0) if on_card else "dry run: fits only"
    print(f"torch {torch.__version__}; {where}")
    print(f"{'model':<8} {'budget':>8} {'batch':>7} {'memfit reserved':>16} {'capped':>8} "
          f"{'capped alloc':>14} {'free reserved':>14} {'free/budget':>11} {'free/memfit':>11}")
    rows, worst, ooms = [], 0.0, 0
    for name in args.models.split(","):
        for text in args.budgets.split(","):
            model, x, y, loss_fn = make(name, 8)
            lf = lambda o, t, f=loss_fn: loss_of(o, t, f)  # noqa: E731
            if on_card:
                model, x, y = model.cuda(), x.cuda(), y.cuda()
                torch.cuda.empty_cache()
            try:
                # The card's loop (real_reserved) drops the output once the loss exists.
                fit = memfit.find_batch_size(model, x, y, loss_fn=lf, optimizer="adam",
                                             budget=text, target_device="cuda",
                                             keep_output=False)
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
                    row["card_reserved"] = -1  # the card ran out
                del xb, yb
                torch.cuda.empty_cache()
                capped = run_capped(name, fit.max_batch, fit.budget_bytes)
                row.update(capped_oom=capped.get("oom"), capped_reserved=capped.get("max_reserved"),
                           capped_allocated=capped.get("max_allocated"),
                           capped_message=capped.get("message"))
            rows.append(row)
            card = row["card_reserved"]
            if card is None:
                cells = f"{'-':>8} {'-':>14} {'-':>14} {'-':>11} {'-':>11}"
            else:
                verdict = {True: "OOM", False: "ran", None: "failed"}[row["capped_oom"]]
                ooms += row["capped_oom"] is not False
                alloc = row["capped_allocated"]
                free = (f"{'OOM':>14} {'-':>11} {'-':>11}" if card < 0 else
                        f"{card:>14,} {card / fit.budget_bytes:>11.3f} "
                        f"{card / max(1, fit.measured_peak_bytes):>11.3f}")
                if card > 0:
                    worst = max(worst, card / fit.budget_bytes)
                alloc = f"{alloc:,}" if alloc is not None else "-"
                cells = f"{verdict:>8} {alloc:>14} {free}"
            print(f"{name:<8} {text:>8} {fit.max_batch:>7} {fit.measured_peak_bytes:>16,} {cells}",
                  flush=True)
            if row.get("capped_message"):
                print(f"         capped: {row['capped_message']}", flush=True)
            del model
            if on_card:
                torch.cuda.empty_cache()
    if on_card:
        print(f"capped at the budget: {ooms} of {len(rows)} ran out of memory (any: memfit's fit "
              f"overshot); on the free card the worst reserved / budget was {worst:.3f}")
    out = args.json or (os.path.join(os.environ["OUT"], "gpu_fit_on_card.json")
                        if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if on_card and ooms else 0


if __name__ == "__main__":
    sys.exit(main())
