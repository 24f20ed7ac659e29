"""A truth that is not memfit's own: whether plain training steps (no
memfit recorder) run on a simulated device of a budget, and the largest
batch that does. Shared by the tests and bench/ to check memfit's answers."""

from __future__ import annotations

import gc
from typing import Any, Callable

import torch

from .._native import tracked_live_bytes
from ..memory.device import simulated_device

__all__: list = []


def plain_steps_run(budget: int, build: Callable[[], Any], step: Callable[..., None],
                    steps: int = 2, seed: int = 0) -> bool:
    """Whether `steps` calls of step(*state) run on a simulated device of
    `budget` bytes, where state = build() (a tuple: the model, its
    optimizer, whatever the loop keeps) is made on that device; an
    out-of-memory error says False. The simulated device counts what is
    allocated as a card's allocator does: the truth does not rest on
    memfit's own measurement.

    The device starts empty: the simulated device counts every tracked byte
    alive in the process, as a card counts its other tenants, so what the
    caller left there (garbage first collected; then what is still alive,
    such as an earlier test's tensors) is added to the budget. Without it a
    tight answer's truth came out by the 16 KiB an unrelated earlier test
    left alive, and depended on the order tests ran in."""
    gc.collect()
    left = tracked_live_bytes("cpu")
    torch.manual_seed(seed)
    state = None
    try:
        with simulated_device(budget + left):
            state = build()
            for _ in range(steps):
                step(*state)
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        # Dropped before collecting: a model in a reference cycle (a forward
        # hook's closure holding it) left its activations as garbage on the
        # device for whatever ran next.
        state = None
        gc.collect()


def loop_body(model: torch.nn.Module, optimizer: Any, x: Any, y: Any,
              loss_fn: Callable, kept: dict | None = None) -> None:
    """One iteration of a user's training loop as it is written in a
    for-loop's body. kept: a dict that holds `pred` and `loss` into the
    next iteration, as PyTorch's quickstart body (`pred = model(X); loss =
    loss_fn(pred, y)`) does: the loop profile and find_batch_size fit by
    default (keep_output=True); None: the one-line loop
    `loss_fn(model(x), y).backward()` (keep_output=False). optimizer: one,
    or a list stepped in turn."""
    if kept is not None:
        kept["pred"] = model(x)
        kept["loss"] = loss_fn(kept["pred"], y)
        kept["loss"].backward()
    else:
        loss_fn(model(x), y).backward()
    optimizers = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
    for o in optimizers:
        o.step()
    for o in optimizers:
        o.zero_grad()


def smallest_budget(runs: Callable[[int], bool], lo: int, hi: int, resolution: int) -> int:
    """The smallest budget, within `resolution` bytes, in which runs(budget)
    holds (plain steps run): by bisection of (lo, hi], where `hi` must run
    and `lo` must not (asserted: a range that misses the peak is the test's
    mistake, not a figure)."""
    assert runs(hi) and not runs(lo), (lo, hi)
    while hi - lo > resolution:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if runs(mid) else (mid, hi)
    return hi


def largest_that_fits(fits: Callable[[int], bool], start: int) -> int:
    """The largest batch for which fits(batch) holds, searched from `start`
    (memfit's answer): up by doubling steps then bisection, or down by
    bisection when `start` itself does not fit; 0 when not even 1 fits.
    Memory grows with the batch (the search assumes it, as any batch search
    does)."""
    lo = max(1, start)
    if not fits(lo):
        hi, lo = lo, 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo
    step = 1
    while fits(lo + step):
        lo += step
        step *= 2
    hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


class GradientCapture(torch.optim.SGD):
    """An optimizer whose step records the gradients it was given and
    changes nothing (lr 0): a split step's accumulated gradients, to hold
    against the whole batch's."""

    def __init__(self, params):
        super().__init__(params, lr=0.0)
        self.grads = None

    def step(self, closure=None):
        self.grads = [p.grad.clone() for g in self.param_groups for p in g["params"]]
