"""What a long call is doing, as it does it: core/plan/progress.h's Progress,
through the binding. progress= on profile, find_batch_size and advise takes
None (silent), True (lines on stderr) or a callable given each line."""

import sys

from .._native import native as _memfit

__all__: list = []


class Progress:
    """One stamped line a step: "[  2.4s] record batch 8 on meta: forward".
    `native` is the core Progress that stamps them, for memfit's C++ steps."""

    def __init__(self, progress=None, what="progress"):
        if progress is True:
            progress = _to_stderr
        elif progress is not None and progress is not False and not callable(progress):
            raise ValueError(f"[{what}] progress must be None, True or a callable taking a "
                             f"line, got {type(progress).__name__}")
        self.native = _memfit.Progress(progress) if progress else _memfit.Progress()

    def __bool__(self):
        return self.native.enabled

    def step(self, what):
        self.native.step(what)

    def relay(self):
        """For the C++ search: its lines, stamped from this start; None when
        silent."""
        if not self:
            return None
        return lambda line: self.step(line.split("] ", 1)[-1])


def as_progress(progress, what="progress"):
    return progress if isinstance(progress, Progress) else Progress(progress, what)


def _to_stderr(line):
    print(f"memfit {line}", file=sys.stderr, flush=True)
