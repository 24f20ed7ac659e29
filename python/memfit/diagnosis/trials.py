"""Re-running a step with a fix applied, to measure what the fix saves.

The doctor cannot re-run the user's loop body, so a trial runs the model's
forward on the last inputs the loop gave it (and, where the fix concerns
backward, a backward from the sum of its outputs), once as the loop ran it
and once with the fix, and compares the bytes the tracking allocator saw.
The user's objects are left as they were: the random generators are forked,
buffers (BatchNorm's running statistics) are put back, and so are the .grad
tensors, which the trials never write into.
"""

import contextlib
from dataclasses import dataclass
from typing import Optional

import torch
from torch.utils import _pytree as pytree

from .._step.compiled import compilation_metrics, fresh_call, graph_break_of, uncompiled_call
from .._step.tracking import Tracking
from .._step.user_state import kept_rng
from .._step.user_step import output_loss

__all__: list = []


@dataclass(frozen=True)
class TrialResult:
    """saving: bytes the fix saved in the re-run (None: not tried); how: what
    was re-run, or why it was not."""

    saving: Optional[int]
    how: str


@contextlib.contextmanager
def _rehearsal(module):
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    try:
        with kept_rng():
            yield
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)


def _forward(inputs):
    module, args, kwargs = inputs
    return module(*args, **kwargs)


def _scalar(output):
    own = output_loss(output)  # an HF model given labels: the loss it trains on
    if own is not None and own.dim() == 0:
        return own
    parts = [t.float().sum() for t in pytree.tree_leaves(output)
             if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not parts:
        raise ValueError("the forward returned no floating-point tensor")
    return torch.stack(parts).sum() if len(parts) > 1 else parts[0]


def _refuse(module):
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        return "not tried: a DistributedDataParallel backward would talk to other ranks"
    for p in module.parameters():
        if getattr(p, "_post_accumulate_grad_hooks", None):
            return "not tried: a parameter has a post-accumulate-grad hook"
    return None


def _trial(fn, inputs):
    if inputs is None:
        return TrialResult(None, "not tried: no forward's inputs were kept")
    try:
        with _rehearsal(inputs[0]):
            return fn(inputs)
    except Exception as e:  # a trial is a bonus: its failure is reported, not raised
        return TrialResult(None, f"not tried: {type(e).__name__}: {e}")


def try_no_grad(inputs, after=0):
    """What running a forward under torch.no_grad() takes off the step's
    peak, re-running it with grad enabled and without: the higher of the
    forward's own peak and the bytes it holds while its output lives plus
    `after` (what the loop allocates on top then: `.argmax()`, a metric).
    The bytes held alone overstated it where the peak lies in the forward
    (128 KiB said, 64 KiB saved). `after` None: the outputs are kept and
    what each forward holds piles up: the bytes held. `inputs`: (module,
    args, kwargs)."""

    def run(inputs):
        peaks = []
        for grad in (True, False):
            t = Tracking()
            try:
                with torch.set_grad_enabled(grad):
                    out = _forward(inputs)
                peaks.append(t.live_bytes if after is None
                             else max(t.peak_bytes, t.live_bytes + after))
                del out
            finally:
                t.stop()
        how = ("bytes held while its output lives" if after is None else
               "the peak of the forward and what the loop does with its output")
        return TrialResult(peaks[0] - peaks[1], "re-ran the last forward with grad and under "
                                                f"torch.no_grad(): {how}")

    return _trial(run, inputs)


def try_item(inputs, backward, steps=3):
    """Accumulating the forward's (summed) output over `steps` forwards, as a
    tensor (every graph hangs on the total) and with .item(): the bytes
    still held afterwards, per step. `backward`: run a backward from each,
    as a training loop does."""

    def run(inputs):
        refused = _refuse(inputs[0]) if backward else None
        if refused:
            return TrialResult(None, refused)
        params = [p for p in inputs[0].parameters() if p.requires_grad]
        held = []
        for as_number in (False, True):
            t = Tracking()
            try:
                total = 0
                with torch.enable_grad():
                    for _ in range(steps):
                        loss = _scalar(_forward(inputs))
                        if backward and loss.requires_grad and params:
                            torch.autograd.grad(loss, params, allow_unused=True)
                        total = total + (loss.item() if as_number else loss)
                        del loss
                held.append(t.live_bytes)
                del total
            finally:
                t.stop()
        return TrialResult(max(held[0] - held[1], 0) // steps,
                           f"re-ran the last forward {steps} times, carrying its summed "
                           "output as a tensor and as .item(): bytes held per step")

    return _trial(run, inputs)


def try_set_to_none(inputs, params, through_backward=True):
    """The peak of a forward and backward with the gradients zeroed but
    present, and with them freed (None). `through_backward`: present until
    backward accumulates into them (set_to_none=False), else freed between
    the forward and backward (zero_grad() after the forward). The user's
    .grad tensors are set aside and put back."""

    def run(inputs):
        refused = _refuse(inputs[0])
        if refused:
            return TrialResult(None, refused)
        ps = [p for p in params if p.requires_grad]
        kept = [p.grad for p in ps]
        peaks = []
        try:
            for zeroed in (True, False):
                t = Tracking()
                try:
                    for p in ps:
                        p.grad = torch.zeros_like(p) if zeroed else None
                    with torch.enable_grad():
                        loss = _scalar(_forward(inputs))
                        if not through_backward:
                            for p in ps:
                                p.grad = None
                        loss.backward()
                        del loss
                    peaks.append(t.peak_bytes)
                finally:
                    for p in ps:
                        p.grad = None
                    t.stop()
        finally:
            for p, g in zip(ps, kept):
                p.grad = g
        how = ("zeroed" if through_backward else "alive through the forward")
        return TrialResult(peaks[0] - peaks[1], f"re-ran the last forward and a backward with "
                                                f"gradients {how} and with them set to None: "
                                                "difference of the peaks")

    return _trial(run, inputs)


def try_without_retain(inputs):
    """The peak of a forward, a backward (torch.autograd.grad: no .grad is
    written) and a second forward while the first loss lives, as a loop
    runs them, with the backward retaining its graph and without."""

    def run(inputs):
        refused = _refuse(inputs[0])
        if refused:
            return TrialResult(None, refused)
        params = [p for p in inputs[0].parameters() if p.requires_grad]
        if not params:
            return TrialResult(None, "not tried: the model has no parameter that requires grad")
        peaks = []
        for retain in (True, False):
            t = Tracking()
            try:
                with torch.enable_grad():
                    loss = _scalar(_forward(inputs))
                    torch.autograd.grad(loss, params, retain_graph=retain, allow_unused=True)
                    nxt = _forward(inputs)
                    del nxt, loss
                peaks.append(t.peak_bytes)
            finally:
                t.stop()
        return TrialResult(peaks[0] - peaks[1], "re-ran the last forward, a backward with and "
                                                "without retain_graph=True and the next forward: "
                                                "difference of the peaks")

    return _trial(run, inputs)


def _output_bytes(gm):
    """Bytes of the tensors a captured graph returns (its example values)."""
    total = 0
    for node in gm.graph.nodes:
        if node.op != "output":
            continue
        for arg in pytree.tree_leaves(node.args):
            value = getattr(arg, "meta", {}).get("example_value")
            if isinstance(value, torch.Tensor):
                total += value.numel() * value.element_size()
    return total


def try_graph_split(inputs):
    """{(file, line): bytes} the graph before each graph break hands the
    graph after it: the last forward re-run once under torch.no_grad() and a
    backend that only captures dynamo's graphs (no inductor), on a function
    of memfit's own (its cache entries are not the model's), and the
    outputs of the graph before each break summed. Returns a TrialResult
    whose `saving` is that dict (None when not tried)."""

    def run(inputs):
        module, args, kwargs = inputs
        graphs = []

        def capture(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        seen = {id(m) for m in compilation_metrics()}
        with torch.no_grad():
            torch.compile(fresh_call(uncompiled_call(module)), backend=capture)(*args, **kwargs)
        handed, last = {}, None
        for m in compilation_metrics():
            if id(m) in seen or getattr(m, "co_name", None) is None:
                continue
            brk = graph_break_of(m)
            if brk is not None and last is not None:
                handed.setdefault((brk.file, brk.line), _output_bytes(last))
            if getattr(m, "graph_op_count", None) and graphs:
                last = graphs.pop(0)
        return TrialResult(handed, "re-ran the last forward under a capturing backend: bytes "
                                   "the graph before the break returns")

    return _trial(run, inputs)
