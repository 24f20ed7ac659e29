"""`python -m memfit doctor script.py [args] [--steps N]`: runs a script
unchanged under the doctor for N steps and prints the report.

Without a model or optimizer to name, the doctor takes any outermost module
call as a forward and any optimizer's step() as a step. The doctor's own
options may come before or after the script; everything after `--` is the
script's:

    python -m memfit doctor train.py --lr 0.1 --steps 8
    python -m memfit doctor --steps 8 train.py -- --steps 1000

Note [The doctor always ends]
The doctor stops a script by raising StopRun (a BaseException) out of the
loop once --steps steps ran, and again at every later forward and step,
should the loop swallow it (`except BaseException: pass`). A script that
swallows them all, or never takes a step, is bounded by --time-limit
seconds of wall time (default 600): a StopRun is raised wherever the script
is then, and if it does not end within 5 more seconds the report of what
was seen is printed and the process exits (status 1) from the timer. A
script that calls os._exit() prints the report first; one interrupted
(KeyboardInterrupt) or dying of any other error prints it after the error.
"""

import os
import runpy
import signal
import sys
import threading
import traceback

from .observe import StopRun
from .session import Doctor

__all__: list = []

USAGE = ("usage: memfit doctor [--steps N] [--time-limit SECONDS] [--no-trials] script.py "
         "[script args ...] [--steps N] [-- script args ...]")
HELP = USAGE + """

Runs script.py unchanged under memfit's doctor for N optimizer steps (default 6) and prints
the memory mistakes it saw (each with its line, bytes per step and fix), and, when the script
dies of an out-of-memory error, where and why. --time-limit bounds the run (default 600
seconds); --no-trials skips re-running the last forward with each fix applied."""
DEFAULT_STEPS = 6
DEFAULT_TIME_LIMIT = 600
_GRACE_SECONDS = 5


def parse(argv):
    """(script, script_args, steps, trials, time_limit) from the command's
    arguments; raises ValueError with the reason."""
    script, script_args, steps, trials = None, [], DEFAULT_STEPS, True
    time_limit = DEFAULT_TIME_LIMIT
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            script_args += args[i + 1:]
            if script is None and script_args:
                script, script_args = script_args[0], script_args[1:]
            break
        if a == "--steps" or a.startswith("--steps="):
            value = a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if "=" in a else 2
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"--steps needs a positive number, got '{value}'")
            steps = int(value)
            continue
        if a == "--time-limit" or a.startswith("--time-limit="):
            value = a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if "=" in a else 2
            try:
                time_limit = float(value)
            except ValueError:
                time_limit = -1.0
            if not 0 < time_limit < 10**7:
                raise ValueError(f"--time-limit needs a positive number of seconds, got '{value}'")
            continue
        if a == "--no-trials":
            trials = False
        elif script is None:
            if a in ("-h", "--help"):
                raise ValueError(USAGE)
            if a.startswith("-"):
                raise ValueError(f"unknown option '{a}'\n{USAGE}")
            script = a
        else:
            script_args.append(a)
        i += 1
    if script is None:
        raise ValueError(f"no script to run\n{USAGE}")
    return script, script_args, steps, trials, time_limit


def _finish_now(doctor, why, code):
    """Prints the report of what the doctor saw so far and ends the process
    at once with `code`: see Note [The doctor always ends]."""
    try:
        doctor.trials = False  # bounded: nothing more runs
        doctor.__exit__(StopRun, StopRun(), None)
        print(doctor.report())
    except BaseException as e:  # the exit below must happen
        print(f"memfit doctor: no report ({type(e).__name__}: {e})", file=sys.stderr)
    print(f"memfit doctor: {why}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    _real_exit(code)


_real_exit = os._exit


class _Bound:
    """The wall-time limit and the os._exit() hook of one run: see Note [The
    doctor always ends]. The limit needs the main thread (signals); off it,
    only --steps bounds the run."""

    def __init__(self, doctor, time_limit):
        self._doctor, self._limit = doctor, time_limit
        self._old_handler = None
        self._armed = False

    def __enter__(self):
        doctor = self._doctor

        def hard_exit(code=0):
            _finish_now(doctor, f"the script called os._exit({code}); the report covers the "
                                f"steps before it", code)

        os._exit = hard_exit
        if self._limit and threading.current_thread() is threading.main_thread():
            self._old_handler = signal.signal(signal.SIGALRM, self._on_alarm)
            signal.setitimer(signal.ITIMER_REAL, self._limit)
            self._armed = True
        return self

    def _on_alarm(self, signum, frame):
        if self._armed == "grace":
            _finish_now(self._doctor, f"the script ran past --time-limit {self._limit:g} s and "
                                      f"did not stop; the report covers what was seen", 1)
        self._armed = "grace"
        signal.setitimer(signal.ITIMER_REAL, _GRACE_SECONDS)
        self.timed_out = True
        raise StopRun()

    timed_out = False

    def __exit__(self, *exc):
        os._exit = _real_exit
        if self._armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old_handler)
            self._armed = False
        return False


def run_script(path, args=(), steps=DEFAULT_STEPS, trials=True, time_limit=None):
    """Runs the script at `path` as __main__ with sys.argv = [path, *args]
    under a Doctor that stops it after `steps` steps, or after `time_limit`
    seconds (None: no limit); returns (doctor, the exception the script
    raised or None, whether the time limit stopped it). sys.argv and
    sys.path are put back. See Note [The doctor always ends]."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    doctor = Doctor(trials=trials, max_steps=steps)
    error = None
    bound = _Bound(doctor, time_limit)
    try:
        # The bound ends before the doctor's report is made; the script's
        # error goes through the doctor (an OOM is its finding), then here.
        with doctor, bound:
            try:
                runpy.run_path(path, run_name="__main__")
            except SystemExit as e:
                if e.code not in (None, 0):
                    raise
    except StopRun:
        pass  # the doctor swallows its own; a second one from the time limit
    except BaseException as e:  # reported (KeyboardInterrupt too), report printed
        error = e
    finally:
        sys.argv[:] = saved_argv
        sys.path[:] = saved_path
    return doctor, error, bound.timed_out


def main(argv):
    """The doctor command; returns its exit status: 0 done, 1 bad input or
    the script failed."""
    if any(a in ("-h", "--help") for a in _own_args(argv)):
        print(HELP)
        return 0
    try:
        script, script_args, steps, trials, time_limit = parse(argv)
    except ValueError as e:
        print(f"memfit doctor: {e}", file=sys.stderr)
        return 1
    if not os.path.isfile(script):
        print(f"memfit doctor: no such script '{script}'", file=sys.stderr)
        return 1
    doctor, error, timed_out = run_script(script, script_args, steps, trials, time_limit)
    if error is not None:
        traceback.print_exception(type(error), error, error.__traceback__)
        print(f"memfit doctor: the script failed ({type(error).__name__}); "
              "the report covers the steps before it", file=sys.stderr)
    if timed_out:
        print(f"memfit doctor: the script ran past --time-limit {time_limit:g} s and was "
              f"stopped; the report covers what was seen", file=sys.stderr)
    print(doctor.report())
    return 1 if error is not None or timed_out else 0


def _own_args(argv):
    """The doctor's own arguments: those before the script (and before --)."""
    for a in argv:
        if a == "--" or not a.startswith("-"):
            return
        yield a
