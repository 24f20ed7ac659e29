"""The records memfit's doctor passes between its modules: a place in the
user's code (Site), what the observer saw during the run (Observation and
its parts) and what the checks conclude (Finding). Finding and KINDS are
also memfit explain's: one type for a finding, from a run or from a CUDA
snapshot's trace.

Event indices: every record that says when something happened gives the
index of the next event of the run's memfit timeline at that moment, so
that `first_event <= i < end_event` are the allocations and frees made in
between.
"""

import os
import warnings
from dataclasses import dataclass, field
from typing import Optional, Tuple, Union

__all__ = ["KINDS", "Site", "Finding"]

# Each kind of finding with the question it answers. A new kind is one entry
# here and the check that finds it (diagnosis/checks.py for a run,
# explain/findings.py for a snapshot's trace).
KINDS = {
    # memfit.doctor: what a run of the user's loop shows.
    "memory_growth": "live memory grows at every step",
    "graph_kept": "autograd graphs kept alive across steps: a tensor that requires grad is "
                  "carried into the next step (`total += loss`, an RNN's hidden state)",
    "tensors_kept": "tensors of one step are still alive at the next step's peak",
    "eval_with_grad": "a forward runs with grad enabled and no backward follows",
    "grads_kept": "gradients are alive through the next forward",
    "float64": "float64 tensors in the step",
    "not_in_place": "an out-of-place activation or add that could run in place",
    "pageable_copy": "host-to-device copies from pageable memory or with non_blocking=False",
    "out_of_memory": "the loop died of an out-of-memory error",
    "recompiles": "the compiled model compiles again at every step (a guard fails: a new "
                  "shape, a changed Python value)",
    "graph_break": "a graph break splits a compiled region in two graphs",
    "kv_cache": "a training forward keeps a KV cache (an HF model with use_cache=True)",
    "retain_graph": "backward(retain_graph=True) keeps the graph's saved tensors alive, and no "
                    "second backward goes through it",
    # memfit explain: what a CUDA snapshot's trace shows (and grads_kept above).
    "peak": "what filled memory at the peak",
    "fragmentation": "reserved bytes the allocator held but could not use",
    "optimizer_first_step": "the optimizer's state appears at its first step and stays",
    "oom": "what was alive when the allocation failed",
    "trace_incomplete": "the trace starts after the program allocated",
    "replay_differs": "memfit's allocator replay differs from the card",
}


@dataclass(frozen=True)
class Site:
    """A line of the user's code: the innermost frame outside torch, memfit,
    the standard library and installed packages."""

    file: str
    line: int
    function: str = ""

    def __str__(self):
        return f"{short_path(self.file)}:{self.line}"


UNKNOWN_SITE = Site("<unknown>", 0, "")


def short_path(path):
    """`path` relative to the working directory when it is under it."""
    if path.startswith("<"):
        return path
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


@dataclass(frozen=True)
class Span:
    """One torch call made by the user's code and the events it caused."""

    first_event: int
    end_event: int
    site: Site
    func: str
    requires_grad: bool = False  # its result requires grad: it extends a graph


@dataclass(frozen=True)
class Marker:
    """A possible step boundary: "optimizer_step" when an optimizer's step()
    returned, "forward" when a forward of the model began."""

    event: int
    kind: str
    optimizer: int = 0  # an optimizer_step's: which optimizer (in the order first seen)


@dataclass
class ForwardCall:
    """One forward of the model (the outermost module call)."""

    index: int
    site: Site
    first_event: int
    end_event: int
    grad_enabled: bool
    input_ids: Tuple[int, ...]  # its positional inputs' storages
    output_ids: Tuple[int, ...]
    has_graph: bool  # an output has a grad_fn
    backward_reached: bool  # a backward ran through one of its outputs
    # Bytes of .grad tensors alive when it began; measured on the first
    # forward after each optimizer step, else None.
    grad_bytes_present: Optional[int] = None
    # Bytes of the KV cache (past_key_values) its output carries, each
    # storage once; 0: none.
    kv_cache_bytes: int = 0
    kv_cache_ids: Tuple[int, ...] = ()  # its storages' allocations
    training: bool = False  # the model was in train mode
    # The events at which a backward ran through one of its outputs (one or
    # more per backward pass: a node of each output).
    backward_events: list = field(default_factory=list)


@dataclass(frozen=True)
class ZeroGradCall:
    event: int
    site: Site
    set_to_none: bool


@dataclass(frozen=True)
class RetainedBackward:
    """A backward called with retain_graph=True (and no create_graph):
    its events [first_event, end_event), the user's line, and (allocation
    id, event) of each result of the graph whose node ran: where backward
    without retain_graph frees what that node saved."""

    first_event: int
    end_event: int
    site: Site
    released: Tuple[Tuple[int, int], ...] = ()


@dataclass(frozen=True)
class GraphUse:
    """A call that took, as input, a tensor with an autograd graph that was
    allocated before the current step began."""

    id: int
    event: int
    site: Site
    func: str


@dataclass(frozen=True)
class Float64Tensor:
    """A float64 tensor (more than one element) a call took or made, once per
    step; id None: memfit did not allocate it (torch.from_numpy)."""

    id: Optional[int]
    event: int
    site: Site
    func: str
    bytes: int


@dataclass(frozen=True)
class HostCopy:
    """A copy from host memory to another device."""

    event: int
    site: Site
    bytes: int
    pinned: bool
    non_blocking: bool
    destination: str


@dataclass(frozen=True)
class InPlaceCandidate:
    """An out-of-place op whose input nothing else referenced (no view, not
    saved by autograd, not a leaf that requires grad) at the time."""

    input_id: int
    output_id: int
    event: int
    site: Site
    func: str
    module: str
    used_later: bool  # a later call took the input: in place would change it


@dataclass(frozen=True)
class CompileEvent:
    """A call of a compiled module during which torch.compile compiled."""

    step: int  # optimizer steps before it
    forward: int  # index of the forward it was in (-1: none)
    site: Site  # the user's line that called the model
    cost: object  # memfit's CompileCost
    shapes: Tuple  # the shapes of the call's tensor arguments


@dataclass(frozen=True)
class Observation:
    """Everything the observer recorded, beside the timeline's events."""

    spans: Tuple[Span, ...]
    markers: Tuple[Marker, ...]
    forwards: Tuple[ForwardCall, ...]
    zero_grads: Tuple[ZeroGradCall, ...]
    graph_uses: Tuple[GraphUse, ...]
    float64: Tuple[Float64Tensor, ...]
    copies: Tuple[HostCopy, ...]
    in_place: Tuple[InPlaceCandidate, ...]
    # Storages of the inputs the doctor still holds for its trials (the last
    # forward's from each line).
    held_ids: frozenset
    end_event: int
    # Bytes of the models' parameters and buffers and the optimizers' state
    # allocated before the doctor started (not in the timeline).
    outside_bytes: int = 0
    # Calls of compiled modules that compiled, and the source files of the
    # modules the loop ran (where the model's graph breaks can lie).
    compiles: Tuple[CompileEvent, ...] = ()
    model_files: frozenset = frozenset()
    # (event, id of the parameter, bytes of its .grad) each time backward
    # wrote a gradient, from the first forward after an optimizer step on.
    accumulations: Tuple[Tuple[int, int, int], ...] = ()
    retained: Tuple[RetainedBackward, ...] = ()
    # Allocations the user moved to the host (`.cpu()`, `.numpy()`) on the
    # CPU that rehearses a GPU run: host memory there, not the device's.
    host_ids: frozenset = frozenset()
    # (allocation id, the Site of the user's forward hook) of what a module
    # with a forward hook of the user's returned: what the hook may keep.
    hook_outputs: Tuple[Tuple[int, Site], ...] = ()
    # Allocations that copy a parameter (copy.deepcopy(model), a state
    # dict's clone): a copy of the weights the loop keeps.
    weight_copies: frozenset = frozenset()


@dataclass(frozen=True)
class Finding:
    """One memory mistake, or one fact about memory, with its fix: what the
    doctor finds in a run and what memfit explain finds in a snapshot.

    kind: a key of KINDS. bytes: the bytes concerned (the doctor's: per
    step, measured in the run; explain's: at the moment the trace shows).
    where: the user's line that allocated the memory or kept it alive (a
    Site), or for a trace a place ("file.py:LINE function"), a phase, or "".
    seen: what was seen. fix: the one-line change. The doctor's findings
    also say what the fix saves: estimated_saving (bytes per step, or off
    the step's peak: see seen), measured_saving (what re-running the step
    with the fix applied saved, None where no fix can be tried
    automatically) and trial (how it was measured, or why it could not
    be)."""

    kind: str
    bytes: int
    where: Union[Site, str]
    seen: str
    fix: str
    estimated_saving: int = 0
    measured_saving: Optional[int] = None
    trial: str = ""

    def as_dict(self) -> dict:
        """The finding as JSON: kind, what (its KINDS question), bytes,
        where, seen and fix."""
        return {"kind": self.kind, "what": KINDS[self.kind], "bytes": self.bytes,
                "where": str(self.where), "seen": self.seen, "fix": self.fix}

    def line(self) -> str:
        """"kind: seen", one line."""
        return f"{self.kind}: {self.seen}"

    # The doctor's names until 0.2; read them as bytes and seen.
    @property
    def bytes_per_step(self) -> int:
        warnings.warn("Finding.bytes_per_step is Finding.bytes", DeprecationWarning, 2)
        return self.bytes

    @property
    def evidence(self) -> str:
        warnings.warn("Finding.evidence is Finding.seen", DeprecationWarning, 2)
        return self.seen
