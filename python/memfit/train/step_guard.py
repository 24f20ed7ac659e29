"""What a micro-batch's forward changes besides the gradients (buffers, the
RNG): put back before a failed attempt is redone, and named after a split
step where it differs from one eager step on the whole batch."""

from __future__ import annotations

import torch

from .._step.device import host_memory

__all__: list = []

# Note [Buffers of a failed micro-batch]
# A forward in training mode writes buffers (BatchNorm's running statistics
# and num_batches_tracked): a micro-batch that runs out of memory after its
# forward would leave its statistics in them, and its redo would add them a
# second time. So the buffers of the modules in training mode (eval-mode
# modules write none) are copied before a micro-batch's first attempt and
# copied back before it is redone. The native step only asks for the same
# start again when the attempt there failed (pos moves on success only), so
# that is how a redo is recognised. Every such buffer is copied: kernels
# such as batch_norm write running statistics without moving their version
# counter, so versions cannot tell which moved. The copies die with the
# step. If the step raises, its gradients are dropped and the buffers go back
# to how they were before it: the step did not happen.
#
# Note [The RNG of a failed micro-batch]
# A forward that draws random numbers (dropout, torch.randn_like, a
# stochastic-depth layer) moves the generators as it runs: a failed attempt
# moved them, and its redo drew from where the failed one stopped. On the
# CPU dropout's masks are drawn in the order of the tensor's elements, so a
# split step drew the masks of the whole batch; after one recovered OOM its
# masks were others, its gradients 0.54 off the eager step's, and the RNG
# after the step not where one eager step leaves it. So the CPU's generator
# and each initialized CUDA device's are saved (in host memory, as
# kept_rng's) with the buffers, put back before a redo and, when the step
# raises, to where they were before it. A split step that moved them is
# named in its report: on CUDA each micro-batch's kernels draw from their
# own offset, and torch.randn draws in blocks, so its draws are not the
# whole batch's (Note [Dropout in a split step], step_notes.py).


def _rng_states():
    """The CPU generator's state and each initialized CUDA device's."""
    devices = range(torch.cuda.device_count()) if torch.cuda.is_initialized() else ()
    with host_memory():
        return torch.get_rng_state(), [(d, torch.cuda.get_rng_state(d)) for d in devices]


def _set_rng_states(states):
    cpu, cards = states
    torch.set_rng_state(cpu)
    for d, state in cards:
        torch.cuda.set_rng_state(state, d)


def _same_rng(a, b):
    return torch.equal(a[0], b[0]) and len(a[1]) == len(b[1]) and all(
        d == e and torch.equal(s, t) for (d, s), (e, t) in zip(a[1], b[1]))


def _same_tensor(b, copy):
    return (b is not None and b.shape == copy.shape and b.dtype == copy.dtype
            and b.device == copy.device and torch.equal(b, copy))


class StepGuard:
    """Copies of the buffers a forward may write and of the RNG it may draw
    from, to undo a failed attempt (See Note [Buffers of a failed
    micro-batch], Note [The RNG of a failed micro-batch])."""

    def __init__(self, module):
        seen, self._named = set(), []  # (module, its name for it, the path, the buffer)
        for path, m in module.named_modules():
            if not m.training:
                continue
            for name, b in m.named_buffers(recurse=False):
                if b is not None and id(b) not in seen:
                    seen.add(id(b))
                    self._named.append((m, name, f"{path}.{name}" if path else name, b))
        self._buffers = [b for *_, b in self._named]
        self._first = None  # copies from before the step
        self._copies = None  # copies from before the attempts at _start
        self._rng_first = None
        self._rng = None
        self._start = None

    def _put_back(self, copies):
        with torch.no_grad():
            for buf, copy in zip(self._buffers, copies):
                buf.copy_(copy)

    def before_attempt(self, start):
        """Called before each attempt at the micro-batch from `start`."""
        if start == self._start:
            # The attempt there failed.
            _set_rng_states(self._rng)
            if self._copies is not None:
                self._put_back(self._copies)
            return
        self._copies = None  # the last position's copies are done with
        self._start, self._rng = start, _rng_states()
        if self._rng_first is None:
            self._rng_first = self._rng
        if not self._buffers:
            return
        with torch.no_grad():
            copies = [buf.clone() for buf in self._buffers]
        self._copies = copies
        if self._first is None:
            self._first = copies

    def restore_before_step(self):
        if self._rng_first is not None:
            _set_rng_states(self._rng_first)
        if self._first is not None:
            self._put_back(self._first)

    def drew_random(self):
        """Whether the generators moved since the step's first attempt."""
        return self._rng_first is not None and not _same_rng(self._rng_first, _rng_states())

    def written_buffers(self, skip=()):
        """Names of the buffers whose values differ from before the step,
        those of the modules in `skip` left out."""
        if self._first is None:
            return []
        out, skipped = [], {id(m) for m in skip}
        with torch.no_grad():
            for (m, name, path, _), copy in zip(self._named, self._first):
                if id(m) in skipped:
                    continue
                b = m._buffers.get(name)  # the forward may have set another tensor
                if not _same_tensor(b, copy):
                    out.append(path)
        return out


# Note [An optimizer step that fails part way]
# An optimizer updates its state and the weights in place, parameter by
# parameter (or list by list, foreach): one that runs out of memory part way
# (Adam's denominator for the 2nd of 4 parameters) has already advanced the
# state of those before (the step count, exp_avg, exp_avg_sq) and maybe
# their weights. The Trainer puts back the state the failed step made, the
# buffers and the RNG, but it cannot put these back without a copy of them
# all on every step; a retry (a larger budget) went on from them, its
# updates off the plain step's (the step count one ahead), and the OOM said
# nothing of it. So their version counters are noted before the step, and a
# step that fails after writing any says how many it wrote and what to do.


class InPlaceWrites:
    """The version counters of the weights and the optimizer state a step
    may write in place, to tell after a failure which it wrote (See Note
    [An optimizer step that fails part way])."""

    def __init__(self, optimizer):
        params = [p for g in optimizer.param_groups for p in g["params"]]
        state = [v for p in params for v in optimizer.state.get(p, {}).values()
                 if isinstance(v, torch.Tensor)]
        self._marks = [(t, t._version) for t in params], [(t, t._version) for t in state]

    def line(self):
        """What the failed step wrote, one line, or "" where it wrote none."""
        params, state = ([t for t, v in marks if t._version != v] for marks in self._marks)
        if not params and not state:
            return ""
        return (f"[Trainer.step] the optimizer step had already updated {len(params)} "
                f"weight(s) and {len(state)} of its state tensor(s) in place when the step "
                f"failed: they are not as before the step, and a step run again goes on from "
                f"them (its update differs from the plain step's); to retry, load the model's "
                f"and the optimizer's state_dict saved before the step")
