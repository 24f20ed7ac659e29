"""The recorded step's phase order from Python: Python's
profile runs core's run_step_protocol with Python callables; what a callable
raises comes back as itself."""

import json

import pytest
import torch

import memfit
from memfit import _memfit
from memfit._step.progress import Progress


def run(log, iterations=2, optimizer=True, **kwargs):
    def says(what):
        return lambda: log.append(what)

    callbacks = _memfit.StepCallbacks(
        begin_phase=lambda phase, it: log.append(f"{phase} {it}"),
        materialize=says("materialize"), inputs=says("inputs()"), forward=says("forward()"),
        loss=says("loss()"), backward=says("backward()"),
        optimizer_step=says("optimizer_step()") if optimizer else None,
        zero_grad=says("zero_grad()"), end_phase=says("end_phase()"))
    _memfit.run_step_protocol(callbacks, iterations=iterations, **kwargs)


def test_python_callables_run_in_the_steps_order():
    log = []
    run(log, iterations=2, optimizer=False)
    one = ["inputs {0}", "inputs()", "forward {0}", "forward()", "loss {0}", "loss()",
           "backward {0}", "backward()", "zero_grad {0}", "zero_grad()", "end_phase()"]
    assert log == ["parameters 1", "materialize"] + [s.format(i) for i in (1, 2) for s in one]


def test_progress_lines_come_stamped_from_the_core():
    lines = []
    run([], iterations=2, progress=Progress(lines.append).native,
        what="record on cpu")
    assert len(lines) == 1 + 2 * 6
    assert lines[0].startswith("[") and lines[0].endswith("s] record on cpu: parameters")
    assert lines[-1].split("] ", 1)[1] == "record on cpu: zero_grad (iteration 2)"


def test_what_a_callable_raises_comes_back_unchanged():
    log = []

    def backward():
        raise torch.cuda.OutOfMemoryError("no room")

    with pytest.raises(torch.cuda.OutOfMemoryError, match="no room"):
        nothing = lambda: None  # noqa: E731
        _memfit.run_step_protocol(
            _memfit.StepCallbacks(begin_phase=lambda p, i: log.append(p), materialize=nothing,
                                  inputs=nothing, forward=nothing, loss=nothing,
                                  backward=backward, zero_grad=nothing, end_phase=nothing),
            iterations=2)
    assert log == ["parameters", "inputs", "forward", "loss", "backward"]


def test_a_missing_callable_is_named():
    with pytest.raises(ValueError, match=r"\[run_step_protocol\] no zero_grad callback"):
        nothing = lambda: None  # noqa: E731
        _memfit.run_step_protocol(
            _memfit.StepCallbacks(begin_phase=lambda p, i: None, materialize=nothing,
                                  inputs=nothing, forward=nothing, loss=nothing,
                                  backward=nothing, optimizer_step=nothing, zero_grad=None,
                                  end_phase=nothing),
            iterations=1)


def test_ddp_buckets_that_take_the_budget_say_so_once_for_both_fronts():
    assert _memfit.budget_beside_ddp_buckets(10 << 20, 4 << 20, "op", "x") == 6 << 20
    with pytest.raises(memfit.DoesNotFit, match=r"^\[find_batch_size\] DDP's gradient buckets "
                       r"alone take 4.00 MiB of the 4.00 MiB budget: use a bigger card, or "
                       r"shard \(report.data_parallel\(\) shows ZeRO/FSDP per rank\)$"):
        _memfit.budget_beside_ddp_buckets(4 << 20, 4 << 20, "find_batch_size",
                                          "report.data_parallel()")


def test_report_phases_are_the_json_phases():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    r = memfit.profile(model, torch.randn(4, 16), torch.randint(0, 4, (4,)), optimizer="sgd")
    assert r.phases == json.loads(r.to_json())["phases"]
    assert list(r.phases[0]) == ["name", "iteration", "live_bytes_after", "delta_bytes",
                                 "peak_bytes", "note"]
