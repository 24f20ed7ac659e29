"""The doctor's report as text: what ran, then each finding with the line,
the bytes, what was seen, the fix and what it saves."""

from .._native import format_bytes
from .records import KINDS

__all__: list = []


def _saving(f):
    if f.kind == "pageable_copy":
        return "time, not memory: the copies overlap with compute"
    if f.kind == "recompiles":
        return (f"compile time at every step, and {format_bytes(f.estimated_saving)} of host "
                f"memory while each compile runs (see seen:)")
    if f.kind == "graph_break":
        if f.trial.startswith("not"):
            return f"the break's graph compile and launches; bytes {f.trial}"
        return (f"{format_bytes(f.estimated_saving)} handed across the break, materialized "
                f"there ({f.trial})")
    est = format_bytes(f.estimated_saving)
    if f.measured_saving is not None:
        return f"{est} estimated, {format_bytes(f.measured_saving)} measured ({f.trial})"
    if f.trial:
        return f"{est} estimated ({f.trial})"
    return f"{est} estimated"


def format_report(findings, steps, step_kind, peak_bytes, peak_step, outside_bytes=0):
    """The report of a run of `steps` complete steps ("optimizer step" or
    "forward" each) whose highest step peak was `peak_bytes` (allocated
    inside the block), beside `outside_bytes` of parameters, buffers and
    optimizer state made before it."""
    what = ("one optimizer.step()" if step_kind == "optimizer step"
            else "one forward of the model; no optimizer step ran")
    head = f"memfit doctor: {steps} steps observed (a step: {what})"
    if steps:
        head += f"; peak {format_bytes(peak_bytes + outside_bytes)} in step {peak_step}"
        if outside_bytes:
            head += (f": {format_bytes(peak_bytes)} allocated in the block + "
                     f"{format_bytes(outside_bytes)} of parameters, buffers and optimizer state "
                     "from before")
    lines = [head]
    if not findings:
        lines.append("no findings: no memory mistake seen in these steps")
        return "\n".join(lines)
    if findings[0].kind == "out_of_memory":
        lines.append(f"the loop ran out of memory at {findings[0].where}: see finding 1")
    lines.append(f"{len(findings)} finding{'s' if len(findings) > 1 else ''}, largest first:")
    for i, f in enumerate(findings, 1):
        lines.append("")
        if f.kind == "out_of_memory":
            lines.append(f"{i}. {f.kind} at {f.where}: {format_bytes(f.bytes)} alive")
        else:
            lines.append(f"{i}. {f.kind} at {f.where}: {format_bytes(f.bytes)} per step")
        lines.append(f"   what:  {KINDS[f.kind]}")
        lines.append(f"   seen:  {f.seen}")
        lines.append(f"   fix:   {f.fix}")
        if f.kind != "out_of_memory":
            lines.append(f"   saves: {_saving(f)}")
    return "\n".join(lines)
