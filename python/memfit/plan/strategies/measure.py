"""Measuring a strategy on the user's model: its peak from memfit.profile of
the transformed step, its time from steps run in the same process."""

import contextlib
import statistics
import time

import torch

from ..._step.batching import batch_size, narrow_batch, resize_batch
from ..._step.loop import Loop
from ...report.profile import profile
from ..._step.user_step import as_user_step
from ..._step.callable_state import CallableState, users_step_functions
from ..._step.user_state import ModelTensors, model_modules, private_copy
from . import TRAIN, applied
from .eval_step import eval_mode, profile_eval, run_eval
from .optimizer import make_optimizer, optimizer_for

__all__: list = []


def cuda_devices(model):
    """Indices of the CUDA devices holding the model's parameters."""
    return sorted({p.device.index or 0 for p in model.parameters() if p.is_cuda})


def sync(devices):
    """Wait for the devices' queued work, so a wall-clock time covers it."""
    for d in devices:
        torch.cuda.synchronize(d)


class Bench:
    """Profiles and times strategies on one model and batch; the model,
    its gradients, the user's optimizer and inputs are left as they were
    (see Note [A rehearsed step leaves no trace])."""

    def __init__(self, model, inputs, target, loss_fn, optimizer, batch_dim, block_paths,
                 repeats, target_device="cpu", around=None, loop=Loop()):
        self.model = model
        self.loop = loop  # the user's loop: See Note [The loop the user runs]
        # around(): a context manager the model is recorded inside (a change
        # made for the recording and undone after); None: none.
        self.around = around
        self.target_device = target_device
        # memfit's own copy: the timed steps may write into it (x.mul_(2)).
        self.inputs = private_copy(inputs)
        self.target = None if target is None else private_copy(target)
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.batch_dim = batch_dim
        self.block_paths = block_paths
        self.repeats = repeats
        self.devices = cuda_devices(model)

    def profile(self, s, batch=None, mode="cpu"):
        """The memfit Report of the step transformed by strategy `s`, at
        `batch` samples (None: the user's; others repeat or cut the samples:
        their shapes, the example's values), on the CPU or on meta. For a CUDA
        target_device the Report has the caching allocator's estimate."""
        m = self.model
        x, y = self.inputs, self.target
        if batch is not None:
            x = resize_batch(x, batch, self.batch_dim)
            y = None if y is None else resize_batch(y, batch, 0)
        with self.as_recorded(), applied(m, s, self.block_paths):
            if s.step != TRAIN:
                report = profile_eval(m, x, y, self.loss_fn, s.step, self.batch_dim)
                if self.target_device == "cuda":
                    report.native.set_cuda_estimate(report.timeline)
                return report
            opt = optimizer_for(m, self.optimizer, s.optimizer, s.zero_grad_in_place,
                                s.host_state)
            return profile(m, x, y, loss_fn=self.loss_fn, optimizer=opt,
                           batch_dim=self.batch_dim, mode=mode,
                           target_device=self.target_device, **self.loop.profile_args())

    def as_recorded(self):
        """The model as profile() records it, inside the block."""
        return self.around() if self.around is not None else contextlib.nullcontext()

    def time_ratio(self, s, micro_batch=0):
        """Median time of a step with strategy `s` over the plain step's:
        `repeats` of each, interleaved (plain, then `s`) after one untimed
        pair, so that both see the same machine. Eval strategies time
        forward and loss; micro_batch > 0 runs the batch in micro-batches of
        that many samples, accumulating."""
        m = self.model
        saved = ModelTensors(m)
        saved.swap_in_copies()  # the timed steps train these copies
        # See Note [What the user's functions keep] (callable_state.py).
        functions = CallableState(users_step_functions(self.loss_fn, (), model_modules(m)))
        plain, ms = [], []
        try:
            plain_opt = make_optimizer(m, self.optimizer)
            opt = (make_optimizer(m, self.optimizer, s.optimizer, s.host_state)
                   if s.step == TRAIN else None)
            for r in range(self.repeats + 1):
                sync(self.devices)
                t0 = time.perf_counter()
                self._train_step(plain_opt, False)
                sync(self.devices)
                t1 = time.perf_counter()
                with applied(m, s, self.block_paths):
                    if s.step == TRAIN:
                        self._train_step(opt, s.zero_grad_in_place, micro_batch)
                    else:
                        with eval_mode(m):
                            run_eval(m, self.inputs, self.target, self.loss_fn, s.step)
                sync(self.devices)
                t2 = time.perf_counter()
                if r > 0:
                    plain.append((t1 - t0) * 1e3)
                    ms.append((t2 - t1) * 1e3)
        finally:
            saved.restore()
            functions.restore()
        base = statistics.median(plain)
        return statistics.median(ms) / base if base > 0 else 0.0

    def _train_step(self, opt, in_place, micro_batch=0):
        if not in_place:  # the other step of the pair may have left gradients
            for p in self.model.parameters():
                p.grad = None
        n = batch_size(self.inputs, self.batch_dim, "advise")
        size = micro_batch if 0 < micro_batch < n else n
        for start in range(0, n, size):
            k = min(size, n - start)
            x = narrow_batch(self.inputs, start, k, self.batch_dim) if size < n else self.inputs
            y = self.target
            if y is not None and size < n:
                y = narrow_batch(y, start, k, 0)
            loss = as_user_step(self.loss_fn).run(self.model, x, y)
            (loss * (k / n) if size < n else loss).backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=not in_place)
        else:
            self.model.zero_grad(set_to_none=not in_place)
