"""What a C++ build needs from the torch of this Python, written as CMake
`set()` lines for cmake/TorchFromPython.cmake. See Note [Torch from Python]
there.

    python torch_flags.py OUT.cmake

The paths are torch.utils.cpp_extension's, the ones every CPU extension is
built with, and the ABI flag is torch's own (the C++ standard is read from
the headers by the CMake side). Nothing here asks for CUDA: memfit compiles
no CUDA code.
"""

import logging
import os
import sys

__all__ = ["flags", "main"]

# The libraries memfit links, dependencies last (as a linker reads them).
LIBRARIES = ("torch", "torch_cpu", "c10", "torch_python")


def _cpp_extension_paths(root: str) -> tuple:
    """cpp_extension's include and library paths for a CPU extension; the same
    paths by hand where cpp_extension does not import (it needs setuptools)."""
    # It warns that no CUDA toolkit is found, which is right and beside the point.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension

        includes, libdirs = cpp_extension.include_paths(), cpp_extension.library_paths()
    except Exception:  # noqa: BLE001 (an old or partial torch: fall back to its layout)
        include = os.path.join(root, "include")
        includes = [include, os.path.join(include, "torch", "csrc", "api", "include")]
        libdirs = [os.path.join(root, "lib")]
    # Older torch lists TH/THC folders its wheel no longer ships; CMake
    # refuses an imported target whose include folder does not exist.
    return [d for d in includes if os.path.isdir(d)], [d for d in libdirs if os.path.isdir(d)]


def flags() -> dict:
    import torch

    root = os.path.dirname(os.path.abspath(torch.__file__))
    includes, libdirs = _cpp_extension_paths(root)
    libs = {}
    for name in LIBRARIES:
        found = [os.path.join(d, f"lib{name}.so") for d in libdirs
                 if os.path.isfile(os.path.join(d, f"lib{name}.so"))]
        if not found:
            raise FileNotFoundError(f"lib{name}.so is not in {', '.join(libdirs)}")
        libs[name] = found[0]
    return dict(version=torch.__version__, root=root, cuda=torch.version.cuda or "",
                includes=includes, libdirs=libdirs, libs=libs,
                cxx11_abi=int(torch.compiled_with_cxx11_abi()))


def _quote(value) -> str:
    text = ";".join(value) if isinstance(value, list) else str(value)
    return '"' + text.replace("\\", "/").replace('"', '\\"') + '"'


def main(argv: list) -> int:
    if len(argv) != 2:
        print("usage: torch_flags.py OUT.cmake", file=sys.stderr)
        return 2
    try:
        f = flags()
    except Exception as e:  # noqa: BLE001 (one line for CMake's message)
        print(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr)
        return 1
    lines = [f"set(MEMFIT_TORCH_{key.upper()} {_quote(f[key])})"
             for key in ("version", "root", "cuda", "includes", "libdirs", "cxx11_abi")]
    lines += [f"set(MEMFIT_TORCH_LIB_{name} {_quote(path)})" for name, path in f["libs"].items()]
    with open(argv[1], "w") as out:
        out.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
