"""The doctor on torch.compile'd models: it does not change what is
compiled, and a recompile at every step and a graph break are findings at
the user's line, with what they cost."""

import inspect
import re

import pytest
import torch

import memfit
from memfit.diagnosis import compile_checks  # noqa: F401  (the checks under test)

pytestmark = pytest.mark.torch_api  # see python/tests/conftest.py


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


class Broken(Small):
    def forward(self, x):
        h = torch.tanh(self.a(x))
        torch._dynamo.graph_break()  # BREAK
        return self.b(h * 2)


def _line_of(cls, marker):
    lines, start = inspect.getsourcelines(cls)
    return start + next(i for i, line in enumerate(lines) if marker in line)


def test_warm_compiled_model_under_the_doctor_compiles_nothing_and_finds_nothing():
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = torch.compile(Small())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))

    def step():
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    step()
    step()
    before = counters["frames"]["total"]
    with memfit.doctor(model, opt) as d:
        for _ in range(3):
            step()
    assert counters["frames"]["total"] == before  # the doctor's mode and hooks stay outside
    assert d.findings == []


@pytest.mark.slow
def test_recompile_at_every_step_and_a_graph_break_are_findings_at_their_lines():
    torch.manual_seed(0)
    model = torch.compile(Broken(), dynamic=False)  # a new shape recompiles each time
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with memfit.doctor(model, opt) as d:
        for n in range(9, 12):
            x, y = torch.randn(n, 16), torch.randint(0, 4, (n,))
            out = model(x)  # CALL
            torch.nn.functional.cross_entropy(out, y).backward()
            opt.step()
            opt.zero_grad()
    kinds = {f.kind: f for f in d.findings}
    this = inspect.getsourcefile(Broken)

    recompiles = kinds["recompiles"]
    call = _line_of(test_recompile_at_every_step_and_a_graph_break_are_findings_at_their_lines,
                    "# CALL")
    assert (recompiles.where.file, recompiles.where.line) == (this, call)
    # Steps 2 and 3 recompile; the first may too, where an earlier compile
    # left an entry on a code object it shares (dynamo then calls it one).
    assert re.search(r"compiled again in [23] of 3 steps", recompiles.seen)
    assert "size mismatch at index 0" in recompiles.seen
    assert "[10, 16], [11, 16]" in recompiles.seen

    brk = kinds["graph_break"]
    assert (brk.where.file, brk.where.line) == (this, _line_of(Broken, "# BREAK"))
    # The graph before the break hands h (n x 32 floats) to the one after it.
    assert brk.bytes == 11 * 32 * 4
    assert "graph_break" in brk.seen or "graph_break()" in brk.seen
    report = d.report()
    assert "recompiles at" in report and "graph_break at" in report
