"""What a long call is doing, as it does it: the Python side of
core/progress.h. progress= on profile, find_batch_size and advise takes
None (silent), True (lines on stderr) or a callable given each line."""

import sys
import time


class Progress:
    """One stamped line a step: "[  2.4s] record batch 8 on meta: forward"."""

    def __init__(self, progress=None, what="progress"):
        if progress is True:
            progress = _to_stderr
        elif progress is not None and progress is not False and not callable(progress):
            raise ValueError(f"[{what}] progress must be None, True or a callable taking a "
                             f"line, got {type(progress).__name__}")
        self._sink = progress or None
        self._start = time.monotonic()

    def __bool__(self):
        return self._sink is not None

    def step(self, what):
        if self._sink is not None:
            self._sink(f"[{time.monotonic() - self._start:6.1f}s] {what}")

    def relay(self):
        """For the C++ search: its lines, stamped from this start; None when
        silent."""
        if self._sink is None:
            return None
        return lambda line: self.step(line.split("] ", 1)[-1])


def as_progress(progress, what="progress"):
    return progress if isinstance(progress, Progress) else Progress(progress, what)


def _to_stderr(line):
    print(f"memfit {line}", file=sys.stderr, flush=True)
