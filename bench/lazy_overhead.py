#!/usr/bin/env python3
"""What memfit.lazy costs.

0. The first call: a step on shapes memfit has not seen (a fresh model: the
   probe and memory caches are keyed by the module) against the first eager
   step of another fresh copy of the same model. Recording runs every
   operation on 2 and 3 samples (the probes); under a budget the step is
   also measured once at 2 and 3 samples to size the chunks, and its first
   chunk is recorded to check that fit (see Note [A fit checked on a chunk]);
   Python's full GC runs only when the plan splits (Note [Garbage and the
   plan]). The goal is <= 2x. Printed in wall time and in the process's CPU
   time (time.process_time, every thread): on a machine shared with other
   work the CPU time is the steadier of the two.
1. No split needed: one training step (zero_grad, forward, loss, backward)
   written with memfit.lazy against the same step written plainly, at the
   same batch. Printed as a ratio of median times; the goal is <= 1.05.
   Measured twice: without a memory budget (lazy runs one chunk at once),
   and on a simulated device whose budget fits the batch (lazy plans the
   chunk size from its cached measurement; both steps run under memfit's
   tracking allocator).
2. Split needed: under a budget where the eager step runs out of memory,
   lazy against a hand-written gradient-accumulation loop using the same
   chunks.

    PYTHONPATH=build/python python3 bench/lazy_overhead.py [--reps N] [--quick]
"""

import argparse
import contextlib
import copy
import statistics
import time

import torch
import torch.nn as nn

import memfit


def mlp():
    """The koila README model (MNIST MLP)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512),
                         nn.ReLU(), nn.Linear(512, 10))


def cnn():
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, 10))


def interleaved(fns, reps, warmup=3):
    """Median time of each fn, measured in alternation so that drift in the
    machine's speed hits all of them alike."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def first_calls(make, batch, budget, reps, clock=time.perf_counter):
    """Median seconds (of `clock`) of the first eager step and of the first
    lazy step, each on a fresh copy of the model (cold caches), under a
    simulated device of `budget` bytes (None: none)."""
    base = make()
    crit = nn.CrossEntropyLoss()
    X = torch.randn(batch, 1, 28, 28)
    Y = torch.randint(0, 10, (batch,))
    crit(base(X), Y).backward()  # torch's own first-call costs, once
    times = {"eager": [], "lazy": []}
    for _ in range(reps):
        for kind in ("eager", "lazy"):
            model = copy.deepcopy(base)
            model.zero_grad(set_to_none=True)
            device = memfit.simulated_device(budget) if budget else contextlib.nullcontext()
            with device:
                t0 = clock()
                if kind == "eager":
                    crit(model(X), Y).backward()
                else:
                    x, y = memfit.lazy(X, Y)
                    crit(model(x), y).backward()
                times[kind].append(clock() - t0)
    return statistics.median(times["eager"]), statistics.median(times["lazy"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = ap.parse_args()
    reps = 8 if args.quick else args.reps
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU")

    # The fixed cost of recording and planning, on a step that computes
    # almost nothing (a second recording of the same shapes hits the probe
    # cache, as every step of a training loop does).
    tiny = nn.Linear(16, 4)
    tx, ty = torch.randn(32, 16), torch.randint(0, 4, (32,))

    def tiny_eager():
        tiny.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(tiny(tx), ty).backward()

    def tiny_lazy():
        tiny.zero_grad(set_to_none=True)
        x, y = memfit.lazy(tx, ty)
        nn.functional.cross_entropy(tiny(x), y).backward()

    t_eager, t_lazy = interleaved([tiny_eager, tiny_lazy], 20 * reps)
    print(f"fixed cost of lazy per step (Linear 16-4, batch 32): "
          f"{(t_lazy - t_eager) * 1e6:.0f} us (eager step {t_eager * 1e6:.0f} us)")

    for name, make, batch in (("MLP 784-512-512-10", mlp, 256), ("CNN 2 conv", cnn, 64)):
        for budget in (None, 1 << 30):
            where = "no budget" if budget is None else f"budget {memfit.format_bytes(budget)}"
            for clock, what in ((time.perf_counter, "wall"), (time.process_time, "CPU")):
                t_eager, t_lazy = first_calls(make, batch, budget, max(3, reps // 4), clock)
                print(f"{name}, batch {batch}, first call, {where}, {what}: eager "
                      f"{t_eager * 1e3:7.2f} ms  lazy {t_lazy * 1e3:7.2f} ms  ratio "
                      f"{t_lazy / t_eager:.2f}  (goal <= 2)")

    for name, make, batch, split in (("MLP 784-512-512-10", mlp, 256, False),
                                     ("CNN 2 conv", cnn, 64, True)):
        model = make()
        crit = nn.CrossEntropyLoss()
        X = torch.randn(batch, 1, 28, 28)
        Y = torch.randint(0, 10, (batch,))

        def eager_step():
            model.zero_grad(set_to_none=True)
            crit(model(X), Y).backward()

        def lazy_step():
            model.zero_grad(set_to_none=True)
            x, y = memfit.lazy(X, Y)
            crit(model(x), y).backward()

        t_eager, t_lazy = interleaved([eager_step, lazy_step], reps)
        print(f"{name}, batch {batch}, no split needed, no budget:    eager "
              f"{t_eager * 1e3:7.2f} ms  lazy {t_lazy * 1e3:7.2f} ms  ratio "
              f"{t_lazy / t_eager:.3f}  (goal <= 1.05)")

        # Peak of one eager step: the budget below which it does not fit.
        model.zero_grad(set_to_none=True)
        with memfit.track() as t:
            crit(model(X), Y).backward()
        peak = t.peak_bytes
        del t
        model.zero_grad(set_to_none=True)

        roomy = 4 * peak
        with memfit.simulated_device(roomy):
            t_eager, t_lazy = interleaved([eager_step, lazy_step], reps)
            run = memfit.last_lazy_run()
        assert len(run.chunks) == 1, run
        print(f"{name}, batch {batch}, no split needed, budget {memfit.format_bytes(roomy)}: "
              f"eager {t_eager * 1e3:7.2f} ms  lazy {t_lazy * 1e3:7.2f} ms  ratio "
              f"{t_lazy / t_eager:.3f}  (goal <= 1.05)")

        if not split:
            # This MLP's memory is mostly its weights and their gradients:
            # splitting its batch saves little (accumulating into .grad
            # needs the gradients plus one more gradient buffer).
            continue
        # A budget where the eager step does not fit.
        tight = int(peak * 0.45)
        with memfit.simulated_device(tight):
            try:
                eager_step()
                raise SystemExit(f"the eager step fits in {tight} bytes: pick a smaller budget")
            except torch.cuda.OutOfMemoryError:
                pass
            model.zero_grad(set_to_none=True)
            lazy_step()  # measures memory per sample once (cached)
            run = memfit.last_lazy_run()
            chunks = list(run.chunks)

            def accumulate():
                model.zero_grad(set_to_none=True)
                for start, size in chunks:
                    loss = crit(model(X[start:start + size]), Y[start:start + size])
                    (loss * (size / batch)).backward()

            t_acc, t_lazy = interleaved([accumulate, lazy_step], reps)
            assert memfit.last_lazy_run().chunks == chunks
        print(f"{name}, batch {batch}, split needed ({len(chunks)} chunks of "
              f"{[s for _, s in chunks]}, budget {memfit.format_bytes(tight)} = 45% of the "
              f"eager peak): hand-written accumulation {t_acc * 1e3:7.2f} ms  lazy "
              f"{t_lazy * 1e3:7.2f} ms  ratio {t_lazy / t_acc:.3f}")


if __name__ == "__main__":
    main()
