"""What a snapshot's stack frames say about an allocation: the phase of the
training step it was made in, and the place in the code it belongs to.

Note [Phases and places from a snapshot's frames]
A snapshot's frames are (filename, line, function name), innermost call
first; Python frames always, C++ frames too with stacks="all".
_record_memory_history records no module path (torch writes a code object's
name, "forward", not its class); a snapshot made from torch.profiler
(_memory_viz._profile_to_snapshot) has "nn.Module: Linear_0" frames, which
give one ("Sequential_0.Linear_0"). So:
- the phase is read from the frames of torch's own code that every step
  passes through: torch/optim/ (optimizer_step; zero_grad by name), the
  autograd engine (backward: C++ frames torch::autograd::Engine, or Python
  frames of torch/autograd/ and Tensor.backward; the engine's device thread
  runs no Python, so backward allocations often have no Python frame at
  all: they are left undecided and take the phase around them), a loss
  function of torch/nn/functional.py or nn/modules/loss.py (loss),
  Module._apply / .to / .cuda (parameters), Module.__call__ (forward);
- the place is the innermost `forward` outside torch (the user's module,
  or a library's such as transformers' modeling_llama.py), else the
  innermost frame of the user's own code, written "file.py:LINE function".
  Every layer of a stack of identical blocks shares its lines, so places
  sum the layers: "which line of the model holds the memory".
"""

import os
import re
from typing import Optional, Sequence, Tuple

from ..diagnosis.frames import is_torch_file, is_user_file  # the one user-file rule
from .snapshot_format import Frame

__all__: list = []

_CPP = re.compile(r"\.(c|cc|cpp|cxx|h|hpp|cu|cuh)$")
_LOSSES = {
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "ctc_loss",
    "cosine_embedding_loss", "margin_ranking_loss", "hinge_embedding_loss",
    "multilabel_margin_loss", "soft_margin_loss", "multi_margin_loss", "triplet_margin_loss",
    "poisson_nll_loss", "gaussian_nll_loss", "ForCausalLMLoss", "fixed_cross_entropy",
}


def is_python_file(filename: str) -> bool:
    return filename.endswith(".py") or filename.startswith("<")


def classify_stack(frames: Sequence[Frame]) -> Optional[str]:
    """The phase an allocation made under `frames` belongs to, or None when
    the frames do not say (See Note [Phases and places from a snapshot's
    frames])."""
    forward = parameters = loss = False
    for f in frames:
        fn, name = f.filename, f.name
        if not is_python_file(fn):  # a C++ frame
            if "torch::autograd::Engine" in name or "AccumulateGrad" in name:
                return "backward"
            continue
        if not is_torch_file(fn):
            continue
        if "/optim/" in fn:
            return "zero_grad" if name == "zero_grad" else "optimizer_step"
        if "/autograd/" in fn or (fn.endswith("torch/_tensor.py") and name == "backward"):
            if name in ("backward", "_engine_run_backward", "grad", "unpack_hook",
                        "_make_grads") or "backward" in name:
                return "backward"
        if fn.endswith("utils/checkpoint.py") and ("unpack" in name or "recompute" in name):
            return "backward"
        if name in _LOSSES and (fn.endswith("nn/functional.py") or "nn/modules/loss.py" in fn):
            loss = True
        if fn.endswith("nn/modules/module.py"):
            if name in ("_apply", "to", "cuda", "to_empty"):
                parameters = True
            elif name in ("_call_impl", "_wrapped_call_impl", "__call__"):
                forward = True
        if "nn/modules/" in fn and name in ("__init__", "reset_parameters"):
            parameters = True
        if fn.endswith("nn/init.py"):
            parameters = True
    if loss:
        return "loss"
    if parameters and not forward:
        return "parameters"
    if forward:
        return "forward"
    return None


MODULE_FRAME = "nn.Module: "


def place_of(frames: Sequence[Frame]) -> str:
    """Where in the code an allocation belongs: the module path when the
    frames name modules (torch.profiler's "nn.Module: Linear_0" frames, in a
    snapshot made by _profile_to_snapshot: "Sequential_0.Linear_0"), else
    "file.py:LINE function" (See Note [Phases and places from a snapshot's
    frames]); "" when no Python frame says."""
    modules = [f.name[len(MODULE_FRAME):] for f in frames if f.name.startswith(MODULE_FRAME)]
    if modules:
        return ".".join(reversed(modules))
    user = None
    for f in frames:
        if not is_python_file(f.filename):
            continue
        if f.name == "forward" and not is_torch_file(f.filename):
            return _label(f)
        if user is None and is_user_file(f.filename):
            user = f
    return _label(user) if user is not None else ""


def _label(f: Frame) -> str:
    return f"{os.path.basename(f.filename)}:{f.line} {f.name}"


def describe(frames: Sequence[Frame], limit: int = 3) -> Tuple[str, ...]:
    """The innermost `limit` Python frames as "file.py:LINE function"."""
    out = [_label(f) for f in frames if is_python_file(f.filename)]
    return tuple(out[:limit])
