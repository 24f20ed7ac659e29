"""Cases run on spawned torch.distributed ranks (gloo on the CPU), for tests
of what every rank must agree on: each rank runs every case in turn in one
process group, and the results come back per case and rank.

    results = run_cases(my_case, {"agree": ["6MiB", "3MiB"]}, tmp_dir)
    results["agree"][1]   # my_case("agree", 1, "3MiB") on rank 1

`case(name, rank, arg)` must be a module-level function (spawn imports its
module in each rank) returning something JSON can write. An exception it
raises is that rank's result, as {"error": type name, "message": text}; a
rank that did not finish by the deadline is killed and gives None."""

import datetime
import json
import multiprocessing
import os
import time

__all__: list = []


def _rank_main(case, cases, rank, world, store, out_dir, group_timeout_s):
    import torch
    import torch.distributed as dist

    results = {}
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                                world_size=world,
                                timeout=datetime.timedelta(seconds=group_timeout_s))
        for name, args in cases.items():
            try:
                results[name] = case(name, rank, args[rank])
            except Exception as e:  # noqa: B902: every failure goes back to the test
                results[name] = dict(error=type(e).__name__, message=str(e))
    except BaseException as e:  # noqa: B902: a failure outside a case ends the run
        results["setup"] = dict(error=type(e).__name__, message=str(e))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    os._exit(0)  # no teardown: a peer that failed could block it


def run_cases(case, cases, out_dir, world=2, group_timeout_s=60, deadline_s=180):
    """{name: {rank: result}} of `case` over `cases` ({name: one arg per rank})
    on `world` spawned ranks. A rank left in a collective fails after
    group_timeout_s instead of hanging; deadline_s bounds the whole run,
    process start-up (each rank imports torch) included. Raises
    RuntimeError when a rank could not join the group."""
    ctx = multiprocessing.get_context("spawn")
    # The group meets in a file of out_dir, not on a TCP port: a port found
    # free here could be taken, before rank 0 binds it, by the gloo pairs of
    # a run beside this one (pytest -n).
    store = os.path.join(str(out_dir), "store")
    if os.path.exists(store):
        os.remove(store)
    procs = [ctx.Process(target=_rank_main,
                         args=(case, cases, r, world, store, str(out_dir), group_timeout_s))
             for r in range(world)]
    for p in procs:
        p.start()
    end = time.monotonic() + deadline_s
    try:
        for p in procs:
            p.join(max(0.0, end - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
    per_rank = {}
    for r in range(world):
        path = os.path.join(str(out_dir), f"rank{r}.json")
        per_rank[r] = json.load(open(path)) if os.path.exists(path) else {}
        if "setup" in per_rank[r]:
            raise RuntimeError(f"rank {r} did not start its cases: {per_rank[r]['setup']}")
    return {name: {r: per_rank[r].get(name) for r in range(world)} for name in cases}
