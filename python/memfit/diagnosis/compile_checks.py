"""The doctor's checks of a compiled model: a recompile at every step, and
graph breaks that split a compiled region (See Note [The doctor beside
compiled code], observe.py)."""

from __future__ import annotations

from .._native import format_bytes
from .._step.compiled import compilation_metrics, graph_break_of
from .records import Finding, Site

__all__: list = []


def _steps(run):
    return max(1, len(run.steps))


def check_recompiles(run) -> list[Finding]:
    """A compiled model that compiled again in at least two steps and in
    at least half of them: each such step pays the compile's time and host
    memory again."""
    events = [e for e in run.observation.compiles if e.cost.recompiles]
    steps = sorted({e.step for e in events})
    n = _steps(run)
    if len(steps) < 2 or len(steps) * 2 < n:
        return []
    seconds = sum(e.cost.seconds for e in events)
    host = max((e.cost.host_peak_bytes or 0) for e in events)
    shapes = []
    for e in events:
        if e.shapes not in shapes:
            shapes.append(e.shapes)
    seen = ", ".join(str(list(s[0]) if len(s) == 1 else [list(x) for x in s])
                     for s in shapes[:4]) + (", ..." if len(shapes) > 4 else "")
    evidence = (f"compiled again in {len(steps)} of {n} steps: {seconds:.1f} s of compiling "
                f"({seconds / len(steps):.1f} s a step), host memory +{format_bytes(host)} "
                f"while compiling; dynamo's reason: {events[-1].cost.recompiles[0]}; the inputs' "
                f"shapes: {seen}")
    fix = ("give every batch one shape (drop_last=True, pad to a fixed length), or mark the "
           "changing dimension dynamic before the first call: torch._dynamo.mark_dynamic(x, "
           "dim); or torch.compile(model, dynamic=True). After recompile_limit (8) compiles "
           "torch runs the model eagerly")
    return [Finding("recompiles", host, events[-1].site, evidence, fix, host)]


def _in_files(brk, files):
    return brk.file in files


def check_graph_breaks(run) -> list[Finding]:
    """Each graph break in the model's source (compiled during the loop or
    before it, as torch's compilation metrics still hold it): the line
    that broke the graph, the reason, the graph it cost to compile, and the
    bytes the first graph hands across it (the trial measures them)."""
    files = run.observation.model_files
    breaks = {}
    for e in run.observation.compiles:
        for b in e.cost.graph_breaks:
            breaks.setdefault((b.file, b.line), (b, e.site))
    for m in compilation_metrics():
        b = graph_break_of(m, list(getattr(m, "restart_reasons", None) or ()))
        if b is not None and _in_files(b, files):
            breaks.setdefault((b.file, b.line), (b, None))
    findings = []
    for (file, line), (b, caller) in breaks.items():
        evidence = (f"dynamo split the compiled region at this line: {b.reason}; the graph "
                    f"after it took {b.seconds:.1f} s to compile, and the tensors handed "
                    f"across it are materialized there (inductor cannot fuse across a break)")
        fix = ("move the Python that breaks the graph out of forward (a print, .item(), a "
               "data-dependent branch), or wrap it in torch.compiler.disable; "
               "torch.compile(model, fullgraph=True) names every break")
        findings.append(Finding("graph_break", 0, Site(file, line, b.function), evidence, fix, 0))
    return findings
