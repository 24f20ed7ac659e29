"""Forward-only eval steps (no_grad, inference_mode), recorded the way
memfit.profile records a training step: for comparison, never a plan."""

import contextlib

import torch

from ..._native import native as _memfit
from ..._step.batching import batch_size
from ..._step.compiled import is_compiled
from ...report.profile import Report
from ..._step.user_step import as_user_step
from ..._step.callable_state import CallableState, users_step_functions
from ..._step.user_state import ModelTensors, model_modules, private_copy
from ..._step.tracking import Tracking

__all__: list = []

GUARDS = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


@contextlib.contextmanager
def eval_mode(model):
    """`model` in eval mode inside the block; each module's mode restored."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, training in modes:
            m.training = training


def run_eval(model, inputs, target, loss_fn, step):
    """Forward and loss under the `step` guard ("no_grad" or
    "inference_mode"); returns the loss as a float."""
    with GUARDS[step]():
        return float(as_user_step(loss_fn).run(model, inputs, target))


def profile_eval(model, inputs, target=None, loss_fn=None, step="no_grad", batch_dim=0):
    """A Report of one eval step: parameters and inputs copied onto the CPU
    (as memfit.profile does), then forward and loss under the `step` guard, with the
    model in eval mode. The model is left as it was."""
    if step not in GUARDS:
        raise ValueError(f"[profile_eval] step must be one of {sorted(GUARDS)}, got {step!r}")
    how = as_user_step(loss_fn, what="profile_eval")
    # See Note [What the user's functions keep] (callable_state.py).
    functions = CallableState(users_step_functions(how, (), model_modules(model)))
    try:
        return _recorded_eval(model, inputs, target, loss_fn, step, batch_dim)
    finally:
        functions.restore()


def _recorded_eval(model, inputs, target, loss_fn, step, batch_dim):
    """profile_eval's recording, the user's functions' state aside."""
    how = as_user_step(loss_fn, what="profile_eval")
    if is_compiled(model):  # compiled before the recording: See Note [Recording a compiled step]
        with eval_mode(model):
            run_eval(model, private_copy(inputs), None if target is None else private_copy(target),
                     loss_fn, step)
    saved = ModelTensors(model)
    t = Tracking()
    t.watch_modules(model, classes=True)
    try:
        with eval_mode(model):
            t.phase("parameters", 1)
            saved.swap_in_copies(torch.device("cpu"), t.classify)
            t.phase("inputs", 1)
            x = private_copy(inputs, torch.device("cpu"))
            y = None if target is None else private_copy(target, torch.device("cpu"))
            t.phase("forward", 1)
            with GUARDS[step]():
                out = how.forward(model, x)
                t.phase("loss", 1)
                loss = how.loss(out, y)
                out = None
            t.end_phase()
            del x, y, out, loss
    finally:
        t.stop()
        saved.restore()
    n = batch_size(inputs, batch_dim, "profile_eval")
    native = _memfit.make_report(t.timeline, type(model).__name__, n, "none", "cpu")
    return Report(native, t.timeline)
