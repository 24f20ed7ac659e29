"""How recorded operations are named in messages, and the line of user code
that recorded them.
"""

import os
import sys

import torch

__all__: list = []


_SKIP_DIRS = (
    # memfit/: the package this module is in, at any depth.
    os.path.dirname(os.path.abspath(sys.modules[__name__.partition(".")[0]].__file__)) + os.sep,
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
)


def user_line():
    """file:line of the user code that recorded the current operation."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(_SKIP_DIRS):
        f = f.f_back
    if f is None:
        return "?"
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"


_REFLECTED = {
    "radd": "add", "rmul": "mul", "rand": "and", "ror": "or", "rxor": "xor",
    "rtruediv": "rdiv", "rdiv": "rdiv", "rsub": "rsub", "rpow": "rpow",
    "rmatmul": "rmatmul", "rfloordiv": "rfloordiv", "rmod": "rmod",
    "truediv": "div", "floordiv": "floor_divide", "mod": "remainder",
    "pos": "positive",
}

INPLACE_DUNDERS = {
    "iadd", "isub", "imul", "itruediv", "idiv", "ifloordiv", "imod", "ipow",
    "imatmul", "iand", "ior", "ixor", "ilshift", "irshift", "setitem",
    "delitem",
}


def op_name(fn):
    """Normalised name of a torch function, for classification."""
    n = getattr(fn, "memfit_op", None) or getattr(fn, "__name__", "") or ""
    if n.startswith("__") and n.endswith("__"):
        n = n[2:-2]
        n = _REFLECTED.get(n, n)
    return n


def display_name(fn):
    """How an operation is named in messages: Tensor.softmax, torch.cat, F.relu."""
    if isinstance(fn, torch.nn.Module):
        return type(fn).__name__
    name = getattr(fn, "memfit_display", None)
    if name:
        return name
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    mod = getattr(fn, "__module__", None) or ""
    head, _, tail = qual.rpartition(".")
    if head in ("_TensorBase", "Tensor", "TensorBase"):
        return f"Tensor.{tail}"
    if head == "_VariableFunctionsClass" or mod == "torch":
        return f"torch.{tail}"
    if mod == "torch.nn.functional":
        return f"F.{qual}"
    if mod.startswith("torch"):
        return f"{mod}.{qual}"
    return qual
