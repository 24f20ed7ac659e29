"""What memfit.track() records: Tracking, the recorder of a block of code
(memfit.memory.tracking has track() itself)."""

from __future__ import annotations


import torch

from .._native import native as _memfit
from .compiled import module_calls, watch_call
from .host_reads import HostReads
from .optimizer_chain import state_values

__all__: list = []


class Tracking:
    """What memfit.track() records: live and peak bytes, and the timeline."""

    def __init__(self) -> None:
        self._recorder = _memfit.Recorder()
        self._hooks = []
        self._finish = []  # run at stop(), before the recorder stops
        self._open_modules = 0  # submodule scopes open now (watch_modules)
        self._reads = HostReads()  # See Note [A step that reads its batch's values].

    @property
    def live_bytes(self) -> int:
        """Bytes allocated inside the block and still alive."""
        return self._recorder.live_bytes

    @property
    def peak_bytes(self) -> int:
        """The most bytes alive at once since the block began."""
        return self._recorder.peak_bytes

    @property
    def timeline(self) -> _memfit.Timeline:
        """Every allocation and free, with phase, module and op."""
        return self._recorder.timeline

    @property
    def value_sized_ops(self) -> list:
        """The ops that ran inside the block and size their output by the
        values (torch.unique, nonzero, sparse gradients), each once: See
        Note [Memory that depends on the batch's values], op_frames.h; then
        each line of the forward, loss or backward phases that read a
        tensor's value into Python, "value read at file:line": See Note [A
        step that reads its batch's values] (host_reads.py)."""
        return list(self._recorder.value_sized_ops) + self._reads.named()

    def phase(self, name: str, iteration: int = 0) -> None:
        """Start the named phase ("forward", "backward", ...)."""
        self._recorder.begin_phase(name, iteration)
        if name in ("forward", "loss", "backward"):
            self._reads.start()
        else:
            self._reads.stop()

    def end_phase(self) -> None:
        """End the current phase: what follows belongs to no phase until the
        next phase() (a step's iteration is over)."""
        self._reads.stop()
        self._recorder.end_phase()

    def only_device(self, device: str) -> None:
        """Record only allocations on `device` ("meta", "cpu"): a meta-mode
        step's bytes are the device's; what stays on the host is left out."""
        self._recorder.only_device(device)

    def drop_meta_kernel_intermediates(self) -> None:
        """Leave out what torch's Python meta kernels allocate beside their
        outputs (See Note [Meta kernels allocate only their outputs],
        op_frames.h)."""
        self._recorder.drop_meta_kernel_intermediates()

    def add_card_kernels(self) -> None:
        """Add what a CUDA card's kernels take inside an op and the host's
        do not (See Note [What a card adds inside an op], card_ops.h), and
        leave out what the host's convolution kernels take and free inside
        the op (See Note [A card's rehearsal drops the host's convolution
        temporaries], op_frames.h)."""
        self._recorder.add_card_kernels()

    def take_conv_workspaces(self) -> list:
        """Each convolution forward's and backward's cuDNN workspace bound since
        add_card_kernels, taken; before stop() (See Note [cuDNN's workspace
        at the step's peak], card_kernels.cpp)."""
        return list(self._recorder.take_conv_workspaces())

    def classify(self, tensor: torch.Tensor, category: str) -> bool:
        """Say what a tensor's memory is: "parameter", "optimizer_state", ..."""
        return self._recorder.classify(tensor, category)

    def watch_modules(self, model: torch.nn.Module, classes: bool = False) -> None:
        """Attribute allocations to module paths ("layer1.0.conv1") while
        `model`'s submodules run their forward; with `classes`, each path
        also names its class ("layer1.0.conv1 (Conv2d)")."""
        recorder = self._recorder
        # Not inside compiled code: See Note [Recording a compiled step].
        for path, module, how in module_calls(model):
            if not path:
                continue
            if classes:
                path = f"{path} ({type(module).__name__})"

            def pre(_module, _inputs, path=path):
                recorder.push_module(path, True)
                self._open_modules += 1

            def post(_module, _inputs, _output):
                recorder.pop_module()
                self._open_modules -= 1

            self._hooks.extend(watch_call(module, how, pre, post))

    def watch_step(self, model: torch.nn.Module,
                   optimizer: torch.optim.Optimizer | None = None) -> None:
        """Name the phases and categories of a training step the user's code
        runs, as profile() does: each forward of `model` begins "forward",
        what follows it "loss", the gradient reaching its output "backward",
        and `optimizer`'s step "optimizer_step"; gradients, optimizer state,
        and parameters and buffers made inside the block are classified.
        See Note [Phases of a step memfit does not run]."""
        state = {"iteration": 0, "phase": None, "live": True, "scope": False}
        recorder = self._recorder
        # See Note [Allocations outside the model's submodules].
        scopes = {"forward": f"({type(model).__name__}'s own forward)", "loss": "(loss)",
                  "backward": "(backward)", "optimizer_step": "(optimizer)",
                  "zero_grad": "(outside the model)"}

        def scope(name):
            if self._open_modules:
                return  # a submodule's scope is on top: keep the stack's order
            if state["scope"]:
                recorder.pop_module()
            recorder.push_module(scopes[name], True)
            state["scope"] = True

        def begin(name):
            if state["live"] and state["phase"] != name:
                state["phase"] = name
                recorder.begin_phase(name, state["iteration"])
                scope(name)

        def pre(_module, _inputs):
            if state["phase"] != "forward":
                state["iteration"] += 1
            begin("forward")

        def post(_module, _inputs, output):
            begin("loss")
            for out in _tensors(output):
                if out.requires_grad:
                    out.register_hook(lambda g: begin("backward"))

        def accumulated(p):
            if state["live"]:
                self.classify(p.grad, "gradient")

        root = next(how for path, _, how in module_calls(model) if not path)
        self._hooks.extend(watch_call(model, root, pre, post))
        for p in model.parameters():
            if p.requires_grad:
                self._hooks.append(p.register_hook(lambda g: begin("backward")))
                self._hooks.append(p.register_post_accumulate_grad_hook(accumulated))
        if optimizer is not None:
            def step_pre(_opt, _args, _kwargs):
                begin("optimizer_step")

            def step_post(opt, _args, _kwargs):
                for st in opt.state.values():
                    for v in state_values(st):
                        if isinstance(v, torch.Tensor) and state["live"]:
                            self.classify(v, "optimizer_state")
                begin("zero_grad")

            self._hooks.append(optimizer.register_step_pre_hook(step_pre))
            self._hooks.append(optimizer.register_step_post_hook(step_post))

        scope("zero_grad")

        def finish():
            if state["scope"] and not self._open_modules:
                recorder.pop_module()
                state["scope"] = False
            state["live"] = False
            for p in model.parameters():
                self.classify(p, "parameter")
                if p.grad is not None:
                    self.classify(p.grad, "gradient")
            for b in model.buffers():
                self.classify(b, "buffer")

        self._finish.append(finish)

    def stop(self) -> None:
        self._reads.stop()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for f in self._finish:
            f()
        self._finish = []
        self._recorder.stop()


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


# Note [Allocations outside the model's submodules]
# Submodules name what they allocate ("0 (Linear)"). What no submodule
# allocates is named by what made it, from the phase the step is in: the
# model's own forward (code in its forward() outside any submodule),
# "(loss)", "(backward)", "(optimizer)", and "(outside the model)" before
# the first forward and after the optimizer's step, never an empty name.
