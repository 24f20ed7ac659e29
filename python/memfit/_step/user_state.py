"""What memfit puts back after running the user's code on the side (a profile,
a timed step, a lazy probe), so that the user's objects are left exactly as
they were: the random number generators, the model's tensors and gradients,
the optimizer's state, the inputs.

Note [A rehearsed step leaves no trace]: memfit.profile, find_batch_size
and advise run training steps the user did not ask to take, and lazy's
probes run the user's modules on a few samples. Afterwards the parameters,
buffers, .grad tensors, optimizer state and learning rate, inputs and RNG
state are exactly as before: the step runs on copies (ModelTensors swaps
copies in for the weights and buffers, their values saved in host memory;
private_copy for the inputs), and what it cannot avoid changing is put
back (kept_rng; OptimizerState; lazy's probes save the probed modules'
buffers, see graph/probe.py's leaving_no_trace). Trainer.step and
lazy's chunks run the step itself, on the user's tensors, exactly once per
sample, as an eager step would.
"""

import copy

import torch

from .. import _memfit
from .batching import map_tensors
from .device import host_memory

__all__ = ["kept_rng", "private_copy", "storage_leaves", "ModelTensors", "OptimizerState"]


def kept_rng():
    """A block after which the CPU's generator and each initialized CUDA
    device's are back where they were: a dropout in a rehearsed step must not
    change what the user's next step draws."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    return torch.random.fork_rng(devices=devices)


def private_copy(obj, device=None):
    """The tensors of `obj` (nested tuple/list/dict) copied (onto `device`,
    default their own), detached from the user's autograd graph: a step run
    on them writes into none of the user's tensors (x.mul_(2) in a forward)
    and leaves no .grad on them. The copy of a tensor that requires grad
    requires grad too, so its gradient is still made (and measured)."""

    def copy_of(t):
        c = t.detach().to(device or t.device, copy=True)
        return c.requires_grad_() if t.requires_grad else c

    return map_tensors(obj, copy_of)


def _to_host(t):
    """A copy of `t`'s values in host memory: CPU RAM beside a GPU; on the
    simulated device, memory outside its budget (host_memory()). A meta
    tensor has no values: its own data is kept (it costs no memory)."""
    if t.is_meta:
        return t.detach()
    with host_memory():
        return t.detach().to("cpu", copy=True)


def storage_leaves(t):
    """The tensors that hold `t`'s memory: itself, or for a wrapper tensor
    subclass (torchao's NF4Tensor: codes, scales, ...) its inner tensors,
    which can be copied and restored in place while the wrapper stays."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not is_traceable_wrapper_subclass(t):
        return [t]
    names, _ = t.__tensor_flatten__()
    return [leaf for n in names for leaf in storage_leaves(getattr(t, n))]


class ModelTensors:
    """A model's parameters and buffers set aside while memfit runs a step on
    copies of them (see swap_in_copies), and each parameter's .grad; restore()
    puts the values back into the same Parameter and buffer objects, exactly,
    and the very same .grad tensors.

    The saved values wait in host memory, not on the device: a profile must
    not need a second copy of the weights on the card it measures (the
    device originals are released when the copies come in, unless the user
    holds views of them). So restore() gives each tensor fresh storage with
    the saved values: a view of a weight taken before the profile no longer
    aliases it afterwards.

    A model on the meta device (built under `with torch.device("meta")`)
    has shapes without values: nothing is copied to the host, and restore()
    gives each tensor back the very meta data it had."""

    def __init__(self, model):
        self.parameters = list(model.parameters())
        self.tensors, self.kinds = [], []
        for i, t in enumerate(self.parameters + list(model.buffers())):
            for leaf in storage_leaves(t):
                self.tensors.append(leaf)
                self.kinds.append("parameter" if i < len(self.parameters) else "buffer")
        self.saved = [(_to_host(t), t.device) for t in self.tensors]
        self.grads = [p.grad for p in self.parameters]
        for p in self.parameters:
            p.grad = None  # the step starts after zero_grad(set_to_none=True)

    def swap_in_copies(self, device=None, classify=None):
        """Give every parameter and buffer a copy of its values (on `device`,
        default its own); classify(tensor, kind) is told of each."""
        with torch.no_grad():
            for i, t in enumerate(self.tensors):
                _memfit.set_data(t, t.data.to(device or t.device, copy=True))
                if classify is not None:
                    classify(t, self.kinds[i])

    def restore(self):
        with torch.no_grad():
            for t, (value, device) in zip(self.tensors, self.saved):
                _memfit.set_data(t, value if value.is_meta else value.to(device, copy=True))
        # After the data: a .grad must match its parameter's device and dtype.
        for p, g in zip(self.parameters, self.grads):
            p.grad = g


_MISSING = object()


class OptimizerState:
    """An optimizer's state and hyperparameters (its learning rate
    included), put back by restore() after memfit's steps updated them."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.state = copy.deepcopy(optimizer.state_dict())
        # An LR scheduler's wrapper of step() sets this flag (it silences
        # the scheduler's "step() before optimizer.step()" warning).
        self.called = optimizer.__dict__.get("_opt_called", _MISSING)

    def restore(self):
        self.optimizer.load_state_dict(self.state)
        if self.called is _MISSING:
            self.optimizer.__dict__.pop("_opt_called", None)
        else:
            self.optimizer._opt_called = self.called

