"""The buffers a chunk's forward may write (BatchNorm's running statistics,
counters kept by a module), put back when the chunk runs out of memory.

Note [A failed chunk leaves no trace]: a chunk that runs out of memory is
redone in halves, so whatever its forward wrote must be undone first, or the
samples it saw would count twice. Gradients are handled by the chunk loop
(the redo leaves out what the failed backward completed); inputs written in
place refuse the redo (their old values are gone); buffers are copied before
each attempt and copied back after an OOM. Copies live in host memory
(memfit.host_memory() on the simulated device, CPU RAM beside a GPU), so
taking them cannot itself run out of device memory. A buffer is copied
again only when it may have changed: its version counter moved, or it is a
running statistic of a norm layer in training mode, which batch_norm
updates without moving the version counter.
"""

import torch

from ..._step.device import host_memory

__all__: list = []

_NORM = torch.nn.modules.batchnorm._NormBase


def written_buffers(modules):
    """The distinct buffers of `modules` (and their submodules), each with
    whether its writes may leave the version counter as it was."""
    seen = {}
    for m in modules:
        for sub in m.modules():
            silent = isinstance(sub, _NORM) and sub.training
            for b in sub.buffers(recurse=False):
                if b is None or b.is_meta:
                    continue
                prev = seen.get(id(b))
                seen[id(b)] = (b, silent or (prev is not None and prev[1]))
    return list(seen.values())


class BufferSnapshot:
    """The values of some buffers before a chunk's attempt (take()), put
    back after it failed (restore())."""

    def __init__(self, buffers):
        self.buffers = buffers
        self.saved = [None] * len(buffers)

    def take(self):
        for i, (b, silent) in enumerate(self.buffers):
            s = self.saved[i]
            if s is None or silent or s[0] != b._version or s[1] != b.data_ptr():
                with host_memory(), torch.no_grad():
                    self.saved[i] = (b._version, b.data_ptr(), b.detach().to("cpu", copy=True))

    def restore(self):
        with torch.no_grad():
            for (b, _silent), (_v, _p, value) in zip(self.buffers, self.saved):
                # Unchanged ones are not written, so a graph that saved them
                # stays valid (a write moves the version counter).
                if not torch.equal(b.detach().cpu(), value):
                    b.copy_(value)
