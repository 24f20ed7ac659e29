"""The `memfit` command (profile, fit, train, advise), as `pip install` puts
it on PATH and as `python -m memfit` runs it: the C++ command line, run
inside this Python process, where torch's meta kernels registered from
Python serve meta mode for any op; its meta recordings put torch's C++
meta kernels in front of them (Note [Native meta kernels],
src/torch/native_meta.cpp), as memfit.profile does.
`memfit doctor script.py` is Python's: it runs the user's script under
memfit.doctor (see memfit.diagnosis.script); so is `memfit explain
snapshot.pickle` (memfit.explain.cli)."""

import signal
import sys

__all__: list = []


def main(argv=None):
    """Runs the command and exits with its status: 0 done, 1 bad input,
    2 out of memory."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["doctor"]:
        from .diagnosis.script import main as doctor_main

        sys.exit(doctor_main(args[1:]))
    if args[:1] == ["explain"]:
        from .explain.cli import main as explain_main

        sys.exit(explain_main(args[1:]))
    # Ctrl-C stops the command at once: the C++ loop never returns to
    # Python's interpreter to see a KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    from ._native import native as _memfit

    sys.exit(_memfit.run_cli(args))
