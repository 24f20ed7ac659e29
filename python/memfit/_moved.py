"""Old module paths that users may import, kept for one release: importing
one warns (DeprecationWarning) and gives the module at its new path, the
same module object, so state and monkeypatches are shared."""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__all__: list = []

# The package was flat until 0.1; each old path and where it lives now.
MOVED = {
    "advising": "plan.advise",
    "batching": "_step.batching",
    "data_parallel": "report.data_parallel",
    "device": "memory.device",
    "distributed": "train.distributed",
    "fit": "plan.fit",
    "host_offload": "memory.offload",
    "lazy_api": "lazy_mode.api",
    "lazy_graph": "lazy_mode.graph",
    "lazy_run": "lazy_mode.run",
    "lazy_tensor": "lazy_mode.tensor",
    "meta_reads": "_step.meta_reads",
    "profiling": "report.profile",
    "progress": "_step.progress",
    "report_page": "report.page",
    "snapshot": "_step.user_state",
    "step_cost": "plan.cost",
    "strategies": "plan.strategies",
    "tracking": "memory.tracking",
    "trainer": "train.trainer",
    "training_step": "_step.training_step",
}


def _new_name(package, fullname):
    """memfit.lazy_graph.node -> memfit.lazy_mode.graph.node; None if not moved."""
    rest = fullname[len(package) + 1:]
    head, dot, tail = rest.partition(".")
    if not fullname.startswith(package + ".") or head not in MOVED:
        return None
    return f"{package}.{MOVED[head]}{dot}{tail}"


def _warn(old, new):
    warnings.warn(f"{old} moved to {new}; the old path goes in the next release",
                  DeprecationWarning, stacklevel=3)


class _Alias(importlib.abc.Loader):
    def __init__(self, new):
        self.new = new

    def create_module(self, spec):
        return importlib.import_module(self.new)

    def exec_module(self, module):
        pass  # already executed at its new path


class _MovedFinder(importlib.abc.MetaPathFinder):
    def __init__(self, package):
        self.package = package

    def find_spec(self, fullname, path=None, target=None):
        new = _new_name(self.package, fullname)
        if new is None:
            return None
        _warn(fullname, new)
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install(package):
    """Lets `import memfit.profiling` (and the rest of MOVED) work, with a
    warning; returns the package's __getattr__ for `memfit.profiling` as an
    attribute."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        # First: a submodule of a moved package (memfit.lazy_graph.node) would
        # otherwise be found on the new package's __path__ and load twice.
        sys.meta_path.insert(0, _MovedFinder(package))

    def moved_attribute(name):
        if name not in MOVED:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        _warn(f"{package}.{name}", f"{package}.{MOVED[name]}")
        return importlib.import_module(f"{package}.{MOVED[name]}")

    return moved_attribute
