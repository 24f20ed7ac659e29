"""memfit's doctor: the memory mistakes of a training or evaluation loop,
each with the user's file:line, the bytes it costs per step (measured) and
the one-line fix.

The user API is memfit.doctor() (session.doctor). This subpackage is named
for what it does, not `doctor`, so that memfit.doctor is that function
without shadowing a submodule.

Modules, each one job: records (the dataclasses passed between the others),
frames (the user's line), observe (what the loop does: torch calls, forwards,
steps, saved tensors), lifetimes (each allocation's life and each step's
peak), checks (one function per kind of finding), trials (re-running with a
fix), report (the text), session (the context manager), script (the
`python -m memfit doctor` command).
"""

from .observe import StopRun
from .records import KINDS, Finding, Site
from .session import Doctor, doctor

__all__ = ["Doctor", "doctor", "Finding", "KINDS", "Site", "StopRun"]
