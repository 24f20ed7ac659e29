"""The doctor's finding for a loop that died of an out-of-memory error: the
user's line, the phase, what was alive by category, and the advice for that
cause (the core's, as the simulated device words its own OOM)."""

from __future__ import annotations

import torch

from .._native import native as _memfit
from .._native import format_bytes
from .._step.oom_explain import explain, live_memory, phase_of
from .frames import is_library_file
from .records import UNKNOWN_SITE, Finding, Site

__all__: list = []

_PHASE_WORDS = {"optimizer_step": "the optimizer step", "backward": "the backward",
                "forward": "the forward", "": "the loop, outside forward, backward and step"}


def is_oom(exc: BaseException | None) -> bool:
    """An out-of-memory error, CUDA's or the simulated device's."""
    return isinstance(exc, torch.cuda.OutOfMemoryError)


def _innermost(tb):
    """(innermost frame, the user's innermost frame and line) of a traceback."""
    last, user = None, None
    while tb is not None:
        last = tb.tb_frame
        code = last.f_code
        if not is_library_file(code.co_filename):
            user = Site(code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return last, user or UNKNOWN_SITE


def oom_finding(exc: BaseException, steps_done: int, model=None, optimizers=None) -> Finding:
    """The finding for `exc`, an OOM that ended the loop after `steps_done`
    complete steps. `model`/`optimizers`: the ones to read (None: every live
    one)."""
    frame, site = _innermost(exc.__traceback__)
    phase = phase_of(frame)
    memory = live_memory("cpu", None if model is None else [model],
                         None if not optimizers else list(optimizers))
    total = memory.parameters + memory.gradients + memory.optimizer_state + memory.rest
    cause, _, advice, what_fills, _ = explain("doctor", "", phase, memory, _memfit.budget("cpu"))
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    evidence = (f"torch.OutOfMemoryError in {_PHASE_WORDS[phase]} of step {steps_done + 1}, "
                f"with {what_fills} alive ({format_bytes(total)} that memfit tracks); the "
                f"error: {first[:300]}")
    return Finding(kind="out_of_memory", bytes=total, where=site, seen=evidence,
                   fix=advice, estimated_saving=0, trial=f"cause: {cause}")
