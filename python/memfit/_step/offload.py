"""memfit.offload: an optimizer's state and step kept on the host.

The ZeRO-Offload trade for one GPU. The device keeps the parameters and
their gradients; the host (CPU RAM) keeps a copy of each parameter, a
gradient buffer and the optimizer's state, and runs the optimizer there.
Each step copies the parameters and gradients to the host and the updated
parameters back into the device parameters' own storage: no optimizer state
and no step temporaries on the device, for three transfers of the
parameters' size and a step on the CPU.

When the CPU itself plays the device (memfit.simulated_device), the host's
tensors are allocated under memfit.host_memory(), so the rehearsal shows
what the card would hold. On the CPU the result equals the wrapped
optimizer's bit for bit (the same arithmetic); on CUDA it differs only by
the CPU's rounding.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .device import host_memory
from .optimizer_chain import state_values

__all__: list = []


def _host_device(p):
    # Beside a GPU, the CPU; beside a CPU or meta "device", the same device,
    # allocated under host_memory().
    return torch.device("cpu") if p.is_cuda else p.device


def _host_hyperparameters(group):
    """A param group's hyperparameters for the host step: fused and
    capturable kernels are CUDA-only, so the host step is the plain one."""
    h = {k: v for k, v in group.items() if k != "params"}
    for flag in ("fused", "capturable"):
        if h.get(flag):
            h[flag] = False
    return h


def construct(cls, groups, defaults):
    """An optimizer of class `cls` over param groups `groups` (dicts with
    their hyperparameters): from the groups alone where the class takes
    them, else with `defaults` as keyword arguments."""
    try:
        return cls(groups)
    except TypeError:
        return cls(groups, **defaults)


class OffloadedOptimizer(torch.optim.Optimizer):
    """`optimizer` (any torch.optim optimizer) with its state and step on the
    host. Made by memfit.offload(optimizer); used like the optimizer it wraps:
    its param_groups are the device parameters with the same hyperparameters
    (an LR scheduler's changes reach the host step), state_dict() is the
    wrapped optimizer's.

    The host copies follow the device: each step copies the parameters to
    the host with their gradients, so weights changed on the device between
    steps (model.load_state_dict, memfit.profile's restore) are what the
    step updates. That is one more transfer of the parameters' size per step
    than keeping the host copy as the master, and no way to go stale."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        if isinstance(optimizer, OffloadedOptimizer):
            raise ValueError("[offload] the optimizer is already offloaded")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"[offload] expected a torch.optim optimizer, got "
                            f"{type(optimizer).__name__}")
        groups = [dict(g) for g in optimizer.param_groups]
        super().__init__(groups, optimizer.defaults)
        self.inner_class = type(optimizer)
        self._device = [p for g in self.param_groups for p in g["params"]]
        self._host = []
        with host_memory(), torch.no_grad():
            host_groups = [self._host_group(g) for g in self.param_groups]
            self.inner = construct(self.inner_class, host_groups, optimizer.defaults)
            if optimizer.state:
                # State already gathered moves to the host copies.
                self.inner.load_state_dict(optimizer.state_dict())

    def _host_group(self, group):
        """`group` over host copies of its parameters, appended to _host."""
        hg = _host_hyperparameters(group)
        hg["params"] = [p.detach().to(_host_device(p), copy=True).requires_grad_(p.requires_grad)
                        for p in group["params"]]
        self._host.extend(hg["params"])
        return hg

    def add_param_group(self, param_group: dict) -> None:
        # A group added after construction (a layer unfrozen mid-training)
        # is stepped on the host too: without this it was never updated.
        super().add_param_group(param_group)
        if not hasattr(self, "inner"):
            return  # Optimizer.__init__ adding the first groups
        group = self.param_groups[-1]
        with host_memory(), torch.no_grad():
            self.inner.add_param_group(self._host_group(group))
        self._device.extend(group["params"])

    def fresh(self) -> OffloadedOptimizer:
        """The same optimizer, offloaded, with no state: over the same device
        parameters and hyperparameters."""
        groups = [dict(g) for g in self.param_groups]
        return OffloadedOptimizer(construct(self.inner_class, groups, self.defaults))

    def _sync_hyperparameters(self):
        for g, hg in zip(self.param_groups, self.inner.param_groups):
            hg.update(_host_hyperparameters(g))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_hyperparameters()
        with host_memory():
            for p, h in zip(self._device, self._host):
                if p.grad is None or p.is_meta:  # meta: no values, nothing to move
                    h.grad = None  # no gradient: the wrapped optimizer skips it
                    continue
                if h.grad is None:
                    h.grad = torch.empty(h.shape, dtype=h.dtype, device=h.device,
                                         pin_memory=p.is_cuda)
                h.grad.copy_(p.grad)
                # See "the host copies follow the device" in the class doc.
                h.copy_(p)
            self.inner.step()
        for p, h in zip(self._device, self._host):
            if h.grad is not None and not p.is_meta:
                p.copy_(h)
        return loss

    def state_dict(self) -> dict:
        # An LR scheduler steps after the optimizer: the host groups learn
        # its lr only at the next step, and the checkpoint must have it now.
        self._sync_hyperparameters()
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        with host_memory():
            self.inner.load_state_dict(state_dict)
        for g, hg in zip(self.param_groups, self.inner.param_groups):
            for k, v in hg.items():
                if k != "params":
                    g[k] = v

    def host_bytes(self) -> int:
        """Bytes kept on the host: parameter copies, gradient buffers and the
        wrapped optimizer's state tensors."""
        total = sum(h.numel() * h.element_size() for h in self._host)
        total += sum(h.grad.numel() * h.grad.element_size() for h in self._host
                     if h.grad is not None)
        for state in self.inner.state.values():
            for v in state_values(state):
                if isinstance(v, torch.Tensor):
                    total += v.numel() * v.element_size()
        return total

    def __repr__(self):
        return f"memfit.offload({self.inner!r})"
