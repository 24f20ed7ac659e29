"""Which line of the user's code is running: the innermost Python frame
outside torch, memfit, the standard library and installed packages.

The one home of "is this the user's file", in two forms:
- is_library_file / user_frame: a frame of this process, read against the
  directories this interpreter loads torch, memfit and the standard library
  from (the doctor, OOM reports);
- is_user_file: a filename recorded elsewhere (a snapshot's frames, read by
  memfit.explain), where those directories are unknown and are recognised
  by their names: torch/, lib/python3.N/, site-packages.
Both count installed packages and frozen modules as library code
(_in_installed_package)."""

import os
import re
import sys
import sysconfig

import torch

from .records import UNKNOWN_SITE, Site

__all__: list = []


def _library_dirs():
    memfit_dir = os.path.dirname(os.path.abspath(sys.modules[__name__.partition(".")[0]].__file__))
    dirs = {os.path.dirname(os.path.abspath(torch.__file__)), memfit_dir}
    for key in ("stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(os.path.realpath(path))
            dirs.add(path)
    return tuple(d.rstrip(os.sep) + os.sep for d in dirs)


_LIBRARY_DIRS = _library_dirs()
_is_library = {}


def is_library_file(filename):
    """True for code the user did not write: torch, memfit, the standard
    library, installed packages, frozen modules."""
    hit = _is_library.get(filename)
    if hit is None:
        hit = (
            filename.startswith(_LIBRARY_DIRS)
            or _in_installed_package(filename)
            or filename.startswith("<frozen")
        )
        _is_library[filename] = hit
    return hit


def _in_installed_package(filename):
    return "site-packages" in filename or "dist-packages" in filename


_TORCH = re.compile(r"(^|/)torch/(?!csrc/)")


def is_torch_file(filename: str) -> bool:
    """A Python file of torch's, by its recorded name."""
    return bool(_TORCH.search(filename)) and filename.endswith(".py")


def is_user_file(filename: str) -> bool:
    """Code the user wrote, by a filename recorded elsewhere (a snapshot's
    frame): a Python file outside installed packages, the standard library
    and frozen modules."""
    if filename.startswith("<"):  # <stdin>, a notebook's cell; not <frozen ...>
        return not filename.startswith(("<frozen", "<built-in", "<string>"))
    if not filename.endswith(".py"):
        return False
    if _in_installed_package(filename):
        return False
    if re.search(r"/lib/python3\.\d+/", filename):
        return False
    return not is_torch_file(filename)


def user_frame(depth=1):
    """(file, line, function) of the innermost frame of the user's code,
    starting `depth` frames above the caller; None if there is none. Cheap:
    no Site is built (see site_of)."""
    f = sys._getframe(depth + 1)
    lib = _is_library
    while f is not None:
        code = f.f_code
        hit = lib.get(code.co_filename)
        if hit is None:
            hit = is_library_file(code.co_filename)
        if not hit:
            return (code.co_filename, f.f_lineno, code.co_name)
        f = f.f_back
    return None


_TORCH_DIRS = tuple(d for d in _LIBRARY_DIRS
                    if d.startswith(os.path.dirname(os.path.abspath(torch.__file__))))


def called_from_other_library(depth=1):
    """Whether the innermost frame outside torch and memfit, starting
    `depth` frames above the caller, is library code (a transformers
    model's forward): a line the user did not write, called from theirs."""
    f = sys._getframe(depth + 1)
    own = _TORCH_DIRS + (_LIBRARY_DIRS_MEMFIT,)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(own):
            return is_library_file(name)
        f = f.f_back
    return False


_LIBRARY_DIRS_MEMFIT = os.path.dirname(
    os.path.abspath(sys.modules[__name__.partition(".")[0]].__file__)) + os.sep
_sites = {}


def site_of(frame_key):
    """The Site for a user_frame() result, one object per line."""
    if frame_key is None:
        return UNKNOWN_SITE
    site = _sites.get(frame_key)
    if site is None:
        site = _sites[frame_key] = Site(*frame_key)
    return site
