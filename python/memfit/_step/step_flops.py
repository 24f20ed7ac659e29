"""FLOPs of a recorded step's forward, loss and backward, counted by the
C++ core while the step is recorded (See Note [FLOPs counted while a step is
recorded], include/memfit/torch/flop_count.h): record_step counts for the
StepFlopCount that counting_flops() opens around it."""

from __future__ import annotations

import contextlib
import contextvars

from .._native import native as _memfit

__all__: list = []

_OPEN = contextvars.ContextVar("memfit_step_flop_count", default=None)


def _registry_ops():
    """The ops torch's flop counter has formulas for, as at::RecordFunction
    names them ("aten::mm")."""
    from torch.utils.flop_counter import flop_registry

    names = []
    for op in flop_registry:
        name = getattr(op, "_qualified_op_name", None) or str(op).replace(".", "::", 1)
        names.append(name)
    return names


class StepFlopCount:
    """What the last step recorded inside counting_flops() ran: `forward`
    (forward and loss) and `backward` FLOPs, and each block's forward FLOPs
    by path; `complete` is False where the step ran an op of torch's flop
    registry that the core has no formula for (count it with
    memfit.plan.cost.count_step_flops instead)."""

    def __init__(self, block_paths):
        self.block_paths = list(block_paths)
        self.forward = 0
        self.backward = 0
        self.blocks = {}
        self.complete = False
        self.uncounted = []  # registry ops the step ran without a formula in the core
        self.recorded = False
        self._native = None
        self._in_forward = False
        self._hooks = []

    # What record_step calls, in the step's order.
    def start(self, model):
        self._native = _memfit.FlopCount(_registry_ops())
        for i, path in enumerate(self.block_paths):
            block = model.get_submodule(path)
            self._hooks.append(block.register_forward_pre_hook(self._entering(i)))
            self._hooks.append(block.register_forward_hook(self._left))

    def _entering(self, i):
        def pre(_module, _inputs):
            if self._in_forward:  # not a recompute inside backward
                self._native.set_block(i)
        return pre

    def _left(self, _module, _inputs, _output):
        self._native.set_block(-1)

    def iteration(self):
        self._native.reset()

    def forward_begins(self):
        self._in_forward = True
        self._native.set_counting(True)

    def backward_begins(self):
        self._in_forward = False
        self._native.set_block(-1)
        self.forward = self._native.total

    def step_begins(self):
        self._native.set_counting(False)

    def stop(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        native, self._native = self._native, None
        if native is None:
            return
        native.stop()
        self.backward = native.total - self.forward
        by_block = native.by_block
        self.blocks = {path: by_block.get(i, 0) for i, path in enumerate(self.block_paths)}
        self.uncounted = list(native.uncounted)
        self.complete = not self.uncounted
        self.recorded = True


def open_count():
    """The StepFlopCount counting_flops() opened, or None."""
    return _OPEN.get()


@contextlib.contextmanager
def counting_flops(block_paths):
    """The FLOPs of the step recorded inside the block (the last one, of its
    last iteration), as a StepFlopCount; block_paths: the paths, in the
    recorded model, whose forward FLOPs are counted apiece."""
    count = StepFlopCount(block_paths)
    token = _OPEN.set(count)
    try:
        yield count
    finally:
        _OPEN.reset(token)
