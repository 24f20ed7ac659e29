"""Is the recorded step still the same step? (the phase
order moved into core's run_step_protocol.) Runs memfit.profile with the
_record_step of a git revision (default 9ae468a, before the move) and with
this tree's, on the same models, optimizers, modes, iteration counts and
set_to_none, and compares event for event (kind, bytes, device, category,
phase, module, op; allocation ids renumbered in order of appearance), the
report's JSON, Report.phases and the progress lines. Prints one line a step
that differs and the count.

    PYTHONPATH=build/python .venv/bin/python bench/record_step_parity.py [--rev 9ae468a]
"""

import argparse
import importlib.util
import itertools
import subprocess
import sys
import tempfile

import torch

import memfit
from memfit.report import profile as profiling


def old_profiling(rev):
    text = subprocess.check_output(["git", "show", f"{rev}:python/memfit/profiling.py"], text=True)
    f = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    f.write(text)
    f.close()
    spec = importlib.util.spec_from_file_location("memfit._profiling_at_rev", f.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # relative imports resolve in this tree's memfit
    return module


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def conv():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4))


MODELS = [(mlp, lambda: (torch.randn(8, 16), torch.randint(0, 4, (8,)))),
          (conv, lambda: (torch.randn(5, 3, 8, 8), torch.randint(0, 4, (5,))))]
OPTIMIZERS = ["adam", "sgd", "momentum", None, "torch.optim.Adam", "adam-offload"]


def recorded(rehearse, make, data, optimizer, mode, iterations, set_to_none):
    """What profile() gives with `rehearse` as its rehearsal."""
    model = make()
    torch.manual_seed(1)
    x, y = data()
    if optimizer == "torch.optim.Adam":
        optimizer = torch.optim.Adam(model.parameters())
    lines = []
    kept = profiling._rehearse
    profiling._rehearse = rehearse
    try:
        r = memfit.profile(model, x, y, optimizer=optimizer, iterations=iterations, mode=mode,
                           set_to_none=set_to_none, progress=lines.append)
    finally:
        profiling._rehearse = kept
    ids = {}
    events = [(k, b, ids.setdefault(i, len(ids)), *rest) for k, b, i, *rest in r.timeline.events()]
    return events, r.to_json(), r.phases, [line.split("] ", 1)[1] for line in lines]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="9ae468a")
    args = ap.parse_args()
    before = old_profiling(args.rev)
    steps = list(itertools.product(MODELS, OPTIMIZERS, ["cpu", "meta"], [1, 2, 3], [True, False]))
    differ = 0
    for (make, data), optimizer, mode, iterations, set_to_none in steps:
        a = recorded(before._rehearse, make, data, optimizer, mode, iterations, set_to_none)
        b = recorded(profiling._rehearse, make, data, optimizer, mode, iterations, set_to_none)
        if a != b:
            differ += 1
            what = [name for name, x, y in zip(("events", "json", "phases", "progress"), a, b)
                    if x != y]
            print(f"differs: {make.__name__} {optimizer} {mode} iterations={iterations} "
                  f"set_to_none={set_to_none}: {', '.join(what)}")
    print(f"{len(steps)} steps, {differ} differ from {args.rev}'s _record_step")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
