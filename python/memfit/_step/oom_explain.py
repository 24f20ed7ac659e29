"""What fills the device when a step runs out of memory, and the advice for
that cause: for the simulated device's own OOM (see Note [What fills the
simulated device], tracking.cpp) and for the doctor's report of a script
that died of one. The cause and the advice are the core's (oom_cause.h)."""

from __future__ import annotations

import dataclasses
import gc
import os
import sys

import torch

from .._native import native as _memfit
from .optimizer_chain import state_values

__all__: list = []

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_OPTIM_DIR = os.path.join(_TORCH_DIR, "optim") + os.sep
_AUTOGRAD_FILES = (os.path.join(_TORCH_DIR, "autograd") + os.sep,
                   os.path.join(_TORCH_DIR, "_tensor.py"))
_MEMFIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Frames of memfit's that run the user's code as it is: the doctor (its
# observer and `memfit doctor`, with the command's entry) and memfit.lazy's
# hook on nn.Module.__call__, which stays installed once lazy ran and passes
# a plain module call through: an OOM under them is the user's.
_USERS_RUNNERS = (os.path.join(_MEMFIT_DIR, "diagnosis") + os.sep,
                  os.path.join(_MEMFIT_DIR, "command.py"),
                  os.path.join(_MEMFIT_DIR, "__main__.py"),
                  os.path.join(_MEMFIT_DIR, "lazy_mode", "tensor", "module_hook.py"))


@dataclasses.dataclass
class OomMemory:
    """Bytes live on the device by what holds them (the core's OomMemory):
    each storage once, only what the simulated device counts."""

    parameters: int = 0
    gradients: int = 0
    optimizer_state: int = 0
    rest: int = 0  # the batch, activations and temporaries, not told apart


def _optimizers_and_models():
    optimizers, models = [], []
    for o in gc.get_objects():
        # type(), not isinstance(): some module objects warn when their
        # __class__ is read.
        kind = type(o)
        if issubclass(kind, torch.optim.Optimizer):
            optimizers.append(o)
        elif issubclass(kind, torch.nn.Module):
            models.append(o)
    return optimizers, models


def live_memory(device="cpu", models=None, optimizers=None):
    """OomMemory now on the simulated `device`. `models`/`optimizers`: those
    to read; None finds every live one (a walk of the garbage collector's
    objects: for an error path only)."""
    if models is None or optimizers is None:
        found_opt, found_models = _optimizers_and_models()
        optimizers = found_opt if optimizers is None else optimizers
        models = found_models if models is None else models
    seen = set()

    def size(t):
        if not isinstance(t, torch.Tensor) or t.device.type != device:
            return 0
        if _memfit.allocation_id(t) is None:
            return 0  # made before tracking, or on the host: not the device's
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in seen:
            return 0
        seen.add(key)
        return storage.nbytes()

    m = OomMemory()
    params = [p for opt in optimizers for g in opt.param_groups for p in g["params"]]
    for model in models:
        params += list(model.parameters()) + list(model.buffers())
    for p in params:
        m.parameters += size(p)
    for p in params:
        m.gradients += size(p.grad) if isinstance(p, torch.Tensor) else 0
    for opt in optimizers:
        for state in opt.state.values():
            for v in state_values(state):
                m.optimizer_state += size(v)
    m.rest = max(0, _memfit.tracked_live_bytes(device) - m.parameters - m.gradients
                 - m.optimizer_state)
    return m


def phase_of(frame):
    """The profile phase the stack from `frame` outward is in:
    "optimizer_step" (inside torch.optim), "backward" (inside autograd's
    backward), "forward" (inside a module's forward), else "". A closure
    that optimizer.step(closure) calls (how Lightning steps) is not the
    optimizer's: what runs inside it has the closure's own phase."""
    in_forward = False
    f, callee = frame, None
    while f is not None:
        name = f.f_code.co_filename
        if name.startswith(_OPTIM_DIR):
            if callee is not None and not callee.f_code.co_filename.startswith(_TORCH_DIR):
                # torch.optim called code outside torch: the user's closure.
                return "forward" if in_forward else ""
            return "optimizer_step"
        if name.startswith(_AUTOGRAD_FILES) and "backward" in f.f_code.co_name:
            return "backward"
        if f.f_code.co_name == "forward" and isinstance(f.f_locals.get("self"), torch.nn.Module):
            in_forward = True
        f, callee = f.f_back, f
    return "forward" if in_forward else ""


def explain(operation, what, phase, memory, budget=None, detail="", state_on_host=False,
            saves=True):
    """(cause, message, advice, what_fills, phase words) from the core: the
    rest counts as activations inside the forward or backward (the batch and
    what the forward saved), as temporaries in a forward that saves nothing
    for a backward (saves=False: grad disabled, an evaluation), as other
    elsewhere."""
    grows = phase in ("forward", "backward", "loss")
    saved = grows and (saves or phase == "backward")
    held = _memfit.OomMemory(
        parameters=memory.parameters, gradients=memory.gradients,
        optimizer_state=memory.optimizer_state, activations=memory.rest if saved else 0,
        temporaries=memory.rest if grows and not saved else 0,
        other=0 if grows else memory.rest)
    e = _memfit.explain_oom(operation, what, phase, held, budget=budget,
                            state_on_host=state_on_host, detail=detail, training=saves)
    return e.cause, e.message, e.advice, e.what_fills, e.phase


def _memfit_machinery(frame):
    """True when memfit's own code (the Trainer, lazy, profile, fit) is on
    the stack: it words its own OOMs, and recovers from many."""
    f = frame
    while f is not None:
        name = f.f_code.co_filename
        if name.startswith(_MEMFIT_DIR) and not name.startswith(_USERS_RUNNERS):
            return True
        f = f.f_back
    return False


_busy = False


def _explain_simulated_oom(nbytes, used, budget, device, message):
    """The simulated device's OOM message: what fills it and the advice for
    that cause, then the allocator's figures. None keeps the allocator's."""
    global _busy
    frame = sys._getframe(1)
    if _busy or _memfit_machinery(frame):
        return None
    _busy = True
    try:
        phase = phase_of(frame)
        memory = live_memory(device)
        if not (memory.parameters or memory.gradients or memory.optimizer_state or memory.rest):
            return None  # nothing to blame: the allocator's figures name the request
        _, text, _, _, _ = explain("simulated_device", "", phase, memory, budget,
                                   _memfit.allocator_figures(message),
                                   saves=torch.is_grad_enabled())
        return text
    finally:
        _busy = False


def install():
    """Has every simulated device's OOM explained (idempotent)."""
    _memfit.set_oom_explainer(_explain_simulated_oom)
