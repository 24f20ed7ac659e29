"""memfit side by side with the real peer libraries, in one process.

Four comparisons, every figure measured in the same run:

fit       On memfit's simulated device (a CPU memory budget whose OOM reads
          "CUDA out of memory.", so the peers' own OOM detectors fire), the
          same model and budget for each method:
          - memfit.find_batch_size(..., budget=the device's size): probes at
            small batches, no full-size step; the probes run on the host CPU
            as they would beside a GPU, so they are not charged to the device;
          - Lightning's Tuner.scale_batch_size, mode "power" and "binsearch",
            its defaults (init_val 2, steps_per_trial 3, max_trials 25,
            margin 0.05, max_val 8192), on a LightningModule wrapping the same
            model (CPU accelerator, no logger, no checkpointing, no progress
            bar; train_dataloader reads self.batch_size, the attribute the
            tuner sets);
          - accelerate's @find_executable_batch_size, once with its default
            starting_batch_size 128 and once starting at 8192 (Lightning's
            max_val: a start above any batch here, for a user who does not
            know the answer). The decorated function is the training: a fresh
            model and Adam, a DataLoader at the batch size, 2 steps; the batch
            it returns with is the one it found.
          The true maximum: the largest batch whose plain training (fresh
          model, Adam, forward, loss, backward, step, zero_grad; 2 iterations)
          runs on the device; found by doubling and bisection, then checked by
          a linear scan around the boundary. Each found batch is then run for
          20 plain steps under the same budget ("survives 20"); Lightning's
          batches also for 20 steps of Lightning's own fit loop.
lazy      memfit.lazy vs koila.lazy on koila's README model (Flatten + 3
          Linear, CrossEntropyLoss) and on the layers koila's issues report it
          fails on (nn.MultiheadAttention, nn.LSTM, a reshape). Without a
          budget and under a budget of half the eager step's memory (eager
          runs out there). koila on a machine without CUDA never splits (it
          reads free memory from NVML); the row "koila, sim. GPU" points its
          free-memory query at the simulated device so that it splits as it
          would on a GPU. Gradients are compared with the eager full batch.
explain   memfit.profile vs torch.distributed._tools.mem_tracker.MemTracker
          on the same step (params on the device, per iteration: batch copy,
          forward, loss, backward, Adam step, zero_grad(set_to_none); 2
          iterations, fresh Adam). Peak, categories at the peak, per module,
          against the bytes measured live by torch.profiler's CPU allocator
          events (independent of memfit) and by memfit.track; wall time over
          the plain step.
estimate  The peak at a large batch predicted by memfit (probes at batches
          4, 8, 16; and meta mode at the batch itself), by MemTracker under
          FakeTensorMode, and by accelerate's estimate (the "Training using
          Adam" column of `accelerate estimate-memory`: estimate_training_usage
          on calculate_maximum_sizes of the local model, weights only), each
          against the measured peak (torch.profiler) of that step.

    PYTHONPATH=build/python .venv/bin/python bench/peers.py [--quick] [--json PATH]
        [--sections fit,lazy,explain,estimate] [--threads 1]

A peer that raises is a result (its exception's first line is reported); the
bench exits 0 when it completes.
"""

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from peers import estimate, explain, fit, lazy  # noqa: E402
from peers.common import all_specs, log, versions  # noqa: E402

SECTIONS = dict(fit=fit, lazy=lazy, explain=explain, estimate=estimate)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller cases (under 20 min)")
    ap.add_argument("--json", metavar="PATH", help="write every figure as JSON to PATH")
    ap.add_argument("--sections", default="fit,lazy,explain,estimate")
    ap.add_argument("--models", default=None,
                    help="only these models in fit/explain/estimate (comma list)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: the machine is shared)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown section {', '.join(unknown)}: choose from {', '.join(SECTIONS)}")
    only = set(args.models.split(",")) if args.models else None

    def pick(cases):
        return [c for c in cases if only is None or c[0] in only]

    t_start = time.perf_counter()

    specs, hf_version = all_specs()
    v = versions()
    if not specs.get("hf-gpt2"):
        v["transformers"] = hf_version
    print(f"# memfit beside its peers ({'quick' if args.quick else 'full'} run)\n")
    print("Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()))
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores, torch threads "
          f"{torch.get_num_threads()}; every figure below measured in this run.\n")
    results = dict(versions=v, quick=args.quick, threads=args.threads)

    for name, section in SECTIONS.items():  # in this order, whatever --sections says
        if name not in sections:
            continue
        log(f"{name} ...")
        t0 = time.perf_counter()
        results[name] = section.run(args.quick, pick, specs)
        print(f"## {section.HEADING}\n")
        print(section.report(results[name]) + "\n")
        print(f"({name} section: {time.perf_counter() - t0:.0f} s)\n")

    wall = time.perf_counter() - t_start
    results["wall_seconds"] = wall
    print(f"wall time {wall:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
