import os
import sys

# make test runs with PYTHONPATH=build/python; allow running pytest alone too.
_build = os.path.join(os.path.dirname(__file__), "..", "..", "build", "python")
if os.path.isdir(_build) and _build not in sys.path:
    sys.path.insert(0, os.path.abspath(_build))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: compiles with inductor several times (skip with -m 'not slow')")
