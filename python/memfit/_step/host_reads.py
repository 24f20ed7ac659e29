"""Where a recorded step reads tensor values into Python: See Note [A step
that reads its batch's values]."""

from __future__ import annotations

import os
import sys
import threading

import torch

__all__: list = []

# Note [A step that reads its batch's values]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A forward can take a branch or a size from its batch's values in Python:
# `if (x.abs() > 4).any():` runs a heavier path, `x[:, :int(mask.sum(1).max())]`
# keeps the batch's longest sample, `.item()` sizes a buffer. No op of the
# recorder's list runs (See Note [Memory that depends on the batch's values],
# op_frames.h), and the probes and the verifying step repeat the example's
# samples, so every one of them took the example's path: a model whose
# heavier path only outliers take answered 203, verified, where plain steps
# on fresh batches ran out above 48 (the heavier path all larger batches
# take, 8 samples rarely). While the forward, the loss and the backward
# are recorded, reads of a tensor's value into Python (bool(), .item(),
# .tolist(), int(), float(), an index) are noted with the user's line that
# made them, and the profile and the fit say they are unsure there, naming
# the lines (report/value_sized.py). The answer stays verified: a read is
# as often a check that picks a path memfit already measures (transformers
# asks whether a padding mask has padding, on every forward given a mask,
# and the fit pads the example's mask: Note [A mask without padding],
# lengths.py) as a branch that sizes memory, and no step of repeated
# samples can tell the two apart. A read inside torch, or of a meta tensor
# (meta mode answers those itself: Note [Data-dependent reads on the meta
# device]), is not noted; what C++ reads inside an op is not seen here.

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_READS = ("__bool__", "item", "tolist", "__int__", "__float__", "__index__")
READ_PREFIX = "value read at "  # how a read is named among the value-sized ops

_lock = threading.Lock()
_watchers: list = []  # the HostReads active now, innermost last
_saved: dict = {}  # torch.Tensor's own attributes the wrappers stand over


def caller_site(skip: tuple = ()) -> str:
    """'file:line' of the innermost frame outside torch, this module and the
    files `skip`, or '?'. Not traceback.extract_stack: it reads each file's
    source lines, which cost 0.3 ms a read of a meta tensor, thousands in
    an LLM's advise."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_TORCH_DIR) and name != __file__ and name not in skip:
            return f"{os.path.basename(name)}:{f.f_lineno}"
        f = f.f_back
    return "?"


def _reading(name, read):
    def wrapper(self, *args, **kwargs):
        if _watchers and not self.is_meta:
            site = caller_site()
            for w in list(_watchers):
                w.saw(site)
        return read(self, *args, **kwargs)
    wrapper.__name__ = name
    return wrapper


def _install():
    for name in _READS:
        _saved[name] = torch.Tensor.__dict__.get(name)
        setattr(torch.Tensor, name, _reading(name, getattr(torch.Tensor, name)))


def _uninstall():
    for name in _READS:
        own = _saved.pop(name)
        if own is None:
            delattr(torch.Tensor, name)
        else:
            setattr(torch.Tensor, name, own)


class HostReads:
    """The sites (file:line, in the order first seen) where tensor values
    were read into Python while watching."""

    def __init__(self) -> None:
        self.sites: list = []
        self._on = False

    def saw(self, site: str) -> None:
        if site != "?" and site not in self.sites:
            self.sites.append(site)

    def start(self) -> None:
        if self._on or torch.compiler.is_compiling():
            return
        with _lock:
            if not _watchers:
                _install()
            _watchers.append(self)
        self._on = True

    def stop(self) -> None:
        if not self._on:
            return
        with _lock:
            _watchers.remove(self)
            if not _watchers:
                _uninstall()
        self._on = False

    def named(self) -> list:
        """Each site as the value-sized ops name it."""
        return [READ_PREFIX + s for s in self.sites]
