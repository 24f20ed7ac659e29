"""memfit's prediction of a card's step, made on the CPU, against the card
itself: each real snapshot under tests/data/snapshots/h200 that names its
step (its .json's "predict": model, batch, optimizer) is compared with the
built-in model profiled here for a CUDA target (what `memfit explain
SNAPSHOT --predict` prints), as the error of the peak allocated and the peak
reserved bytes. The truth is the card's own trace, not memfit's replay.
Where the step has convolutions, the last column is the top of the range
cuDNN's workspaces can add (Note [cuDNN's workspace at the step's peak]):
the point's errors stay the point's. The column before it reads the card's
own peak: where it is a block freed again before anything else is allocated
(a kernel's workspace, cuDNN's in a convolution), its bytes and the bytes
live beside it, to set against the point.

    PYTHONPATH=build/python .venv/bin/python bench/card_predict.py [--table]
"""

import argparse
import glob
import json
import os

import memfit
from memfit._native import native as _memfit

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "data", "snapshots", "h200")
MARK = "cuDNN convolution's workspace (not counted)"  # kCudnnWorkspaceMark


def top_transient(snapshot):
    """(bytes, live beside) of the block allocated at the card's peak when it
    is freed before the next allocation; None otherwise."""
    events = snapshot.timeline.events()
    i = snapshot.timeline.peak().event_index
    _, nbytes, ident = events[i][:3]
    for e in events[i + 1:]:
        if e[0] == "alloc":
            return None
        if e[2] == ident:
            return nbytes, snapshot.peak_allocated_bytes - nbytes
    return None


def live_at_marks(timeline, offset):
    """The point's live bytes (plus `offset`, what the comparison adds to it)
    at each convolution's marks, its forward's and its backward's."""
    live, at = 0, set()
    for e in timeline.events():
        live += e[1] if e[0] == "alloc" else -e[1]
        if e[0] == "alloc" and e[-1] == MARK:
            at.add(live + offset)
    return at


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="store_true", help="each phase too")
    args = parser.parse_args()
    print("| snapshot | step | allocated | reserved | card's peak | with cuDNN's workspaces |")
    print("|---|---|---|---|---|---|")
    for path in sorted(glob.glob(os.path.join(FIXTURES, "*.pickle"))):
        with open(path[: -len(".pickle")] + ".json") as f:
            p = json.load(f).get("predict")
        if not p:
            continue
        report, timeline = _memfit.profile_builtin(
            p["model"], p["batch"], p.get("optimizer", "adam"), p.get("iterations", 2),
            p.get("cuda_workspace", _memfit.DEFAULT_CUDA_WORKSPACE))
        snapshot = memfit.load_snapshot(path)
        c = snapshot.compare(report, timeline)
        top = top_transient(snapshot)
        peak = "-" if top is None else f"{top[1]} B live + a {top[0]} B transient"
        if top is not None and top[1] in live_at_marks(timeline, c.workspace_bytes):
            peak += " (live: the point's at a convolution backward)"
        step = f"{p['model']} x {p['batch']}, {p.get('optimizer', 'adam')}"
        cudnn = "-"
        if c.cudnn_workspace_bytes is not None:
            cudnn = (f"allocated up to {100 * c.allocated_upper_error:+.1f}%, reserved up to "
                     f"{100 * c.reserved_upper_error:+.1f}% (card "
                     f"{'inside' if c.allocated_in_range else 'outside'} the allocated range)")
        print(f"| {os.path.basename(path)} | {step} | {100 * c.allocated_error:+.1f}% | "
              f"{100 * c.reserved_error:+.1f}% | {peak} | {cudnn} |")
        if args.table:
            print(c.table())


if __name__ == "__main__":
    main()
