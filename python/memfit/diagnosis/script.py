"""`python -m memfit doctor script.py [args] [--steps N]`: runs a script
unchanged under the doctor for N steps and prints the report.

Without a model or optimizer to name, the doctor takes any outermost module
call as a forward and any optimizer's step() as a step. The doctor's own
options may come before or after the script; everything after `--` is the
script's:

    python -m memfit doctor train.py --lr 0.1 --steps 8
    python -m memfit doctor --steps 8 train.py -- --steps 1000
"""

import os
import runpy
import sys
import traceback

from .session import Doctor

__all__ = ["USAGE", "DEFAULT_STEPS", "parse", "run_script", "main"]

USAGE = ("usage: memfit doctor [--steps N] [--no-trials] script.py [script args ...] "
         "[--steps N] [-- script args ...]")
DEFAULT_STEPS = 6


def parse(argv):
    """(script, script_args, steps, trials) from the command's arguments;
    raises ValueError with the reason."""
    script, script_args, steps, trials = None, [], DEFAULT_STEPS, True
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
    return script, script_args, steps, trials


def run_script(path, args=(), steps=DEFAULT_STEPS, trials=True):
    """Runs the script at `path` as __main__ with sys.argv = [path, *args]
    under a Doctor that stops it after `steps` steps; returns (doctor, the
    exception the script raised or None). sys.argv and sys.path are put
    back."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    doctor = Doctor(trials=trials, max_steps=steps)
    error = None
    try:
        with doctor:
            try:
                runpy.run_path(path, run_name="__main__")
            except SystemExit as e:
                if e.code not in (None, 0):
                    error = e
            except Exception as e:  # reported, and the report still printed
                error = e
    finally:
        sys.argv[:] = saved_argv
        sys.path[:] = saved_path
    return doctor, error


def main(argv):
    """The doctor command; returns its exit status: 0 done, 1 bad input or
    the script failed."""
    try:
        script, script_args, steps, trials = parse(argv)
    except ValueError as e:
        print(f"memfit doctor: {e}", file=sys.stderr)
        return 1
    if not os.path.isfile(script):
        print(f"memfit doctor: no such script '{script}'", file=sys.stderr)
        return 1
    doctor, error = run_script(script, script_args, steps, trials)
    if error is not None:
        traceback.print_exception(type(error), error, error.__traceback__)
        print(f"memfit doctor: the script failed ({type(error).__name__}); "
              "the report covers the steps before it", file=sys.stderr)
    print(doctor.report())
    return 1 if error is not None else 0
