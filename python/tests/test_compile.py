"""memfit on torch.compile'd models: the step recorded as it runs once
compiled, compiling counted apart. inductor builds C++ kernels on the CPU
(seconds per graph here): the models are tiny and one compiled model is
shared by the tests of this module."""

import json
import math

import pytest
import torch

import memfit
from memfit.testing import models

pytestmark = pytest.mark.torch_api  # see python/tests/conftest.py

D, T, B = 48, 16, 12


def Pointwise():
    """The issue's model, small: memfit.testing's with width D, 4 pointwise
    layers, 5 classes."""
    return models.Pointwise(d=D, n=4, classes=5)


def make(dtype=torch.float32):
    torch.manual_seed(0)
    return Pointwise().to(dtype)


def batch(n, dtype=torch.float32):
    g = torch.Generator().manual_seed(n)
    return torch.randn(n, T, D, generator=g).to(dtype), torch.randint(0, 5, (n,), generator=g)


def train_step(model, opt, x, y):
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def warm_peak(model, n):
    """The truth: the peak of a warm compiled step at batch n, measured by
    memfit.track around the step (the batch copied inside it, as profile
    copies it), plus what lives across steps (weights, Adam's state)."""
    x, y = batch(n)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(2):
        train_step(model, opt, x, y)
    resident = sum(p.nbytes for p in model.parameters()) + sum(
        v.nbytes for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    with memfit.track() as t:
        train_step(model, opt, x.clone(), y.clone())
    return resident + t.peak_bytes


@pytest.fixture(scope="module")
def cold():
    """A model compiled and profiled cold (its first call is memfit's), then
    its warm step measured: (compiled model, report, warm peak)."""
    model = torch.compile(make())
    x, y = batch(B)
    report = memfit.profile(model, x, y, optimizer="adam", compare_eager=True)
    return model, report, warm_peak(model, B)


def test_cold_profile_of_a_compiled_model_equals_its_warm_step(cold):
    model, report, truth = cold
    assert abs(report.peak_bytes - truth) <= 0.01 * truth, (report.peak_bytes, truth)
    cost = report.compile
    assert cost.compiled and cost.graphs >= 1 and cost.seconds > 0
    assert cost.graph_breaks == [] and cost.recompiles == [] and cost.recorded_warm
    assert any(n.startswith("compiled (the model): the step recorded warm") for n in report.notes)
    assert report.native.model == "Pointwise"
    assert json.loads(report.to_json())["compile"]["graphs"] == cost.graphs


def test_compare_eager_says_what_compiling_saves_from_two_recorded_steps(cold):
    _, report, _ = cold
    eager = memfit.profile(make(), *batch(B), optimizer="adam")
    assert report.eager_peak_bytes == eager.peak_bytes
    saved = eager.peak_bytes - report.peak_bytes
    assert saved > 0  # inductor keeps fewer of the pointwise intermediates
    line = report.compare_eager()
    assert line.startswith(f"compiling saves {memfit.format_bytes(saved)} "
                           f"({saved / eager.peak_bytes:.0%}) of this step's peak")
    assert line in report.notes


def test_prediction_of_a_compiled_step_at_twice_the_batch(cold):
    model, report, _ = cold
    predicted = report.prediction(2 * B).predicted_bytes
    log = report.compile_log
    # The probes compiled once, with a dynamic batch dimension: not per batch.
    assert sum(1 for _, c in log[1:] if c.compiled) <= 1
    truth = warm_peak(model, 2 * B)
    assert abs(predicted - truth) <= 0.02 * truth, (predicted, truth)


def test_find_batch_size_on_a_compiled_model_is_safe_and_tight(cold):
    model, report, truth_b = cold
    budget = int(truth_b * 2.5)
    fit = memfit.find_batch_size(model, *batch(B), optimizer="adam", budget=budget)
    assert fit.verified
    assert any(n.startswith("compiled:") for n in fit.notes), fit.notes
    assert warm_peak(model, fit.max_batch) <= budget
    # Within 5% of the true maximum: 5% more samples do not fit.
    assert warm_peak(model, math.ceil(fit.max_batch * 1.05)) > budget


def test_warm_step_tracked_with_model_and_optimizer_does_not_recompile(cold):
    from torch._dynamo.utils import counters

    model = cold[0]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = batch(B)
    train_step(model, opt, x, y)
    before = counters["frames"]["total"]
    with memfit.track(model, opt) as t:
        train_step(model, opt, x, y)
    assert counters["frames"]["total"] == before
    phases = {e[5] for e in t.timeline.events()}
    assert {"forward", "backward", "optimizer_step"} <= phases


def test_model_compiled_in_place_profiles_as_torch_compile(cold):
    _, report, truth = cold
    model = make()
    model.compile()
    r = memfit.profile(model, *batch(B), optimizer="adam")
    assert abs(r.peak_bytes - truth) <= 0.01 * truth
    assert model._compiled_call_impl is not None  # left compiled, hooks removed
    assert not model._forward_hooks and not model._forward_pre_hooks


def test_meta_mode_on_a_compiled_model_records_the_eager_step_and_says_so(cold):
    model = cold[0]
    x, y = batch(B)
    r = memfit.profile(model, x, y, optimizer="adam", mode="meta")
    eager = memfit.profile(make(), x, y, optimizer="adam", mode="meta")
    assert r.peak_bytes == eager.peak_bytes
    assert any("eager step on the meta device" in n and "compiled may differ" in n
               for n in r.notes)


def test_without_a_cxx_compiler_memfit_says_so_in_one_line():
    import torch._inductor.config as inductor_config

    model = torch.compile(make())
    x, y = batch(4)
    with inductor_config.patch({"cpp.cxx": ("/nonexistent/g++",)}):  # what inductor searches
        r = memfit.profile(model, x, y, optimizer="adam")
    lines = [n for n in r.notes if "inductor cannot build CPU kernels" in n]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "No working C++ compiler" in lines[0]
    assert r.peak_bytes == memfit.profile(make(), x, y, optimizer="adam").peak_bytes


def test_a_compile_that_fails_for_want_of_a_compiler_records_eager():
    from torch._inductor.exc import InvalidCxxCompiler

    def no_compiler(gm, example_inputs):
        raise InvalidCxxCompiler()

    x, y = batch(4)
    r = memfit.profile(torch.compile(make(), backend=no_compiler), x, y, optimizer="adam")
    assert any("could not build CPU kernels" in n for n in r.notes)
    assert r.peak_bytes == memfit.profile(make(), x, y, optimizer="adam").peak_bytes


# fp64: eager and compiled gradients differ only by the order inductor's
# fused kernels add in, ~1e-16 relative; a sample dropped or counted twice
# would be off by >= 1/21. 1e-12 sits between.
def _eager_gradients(x, y):
    model = make(torch.float64)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return [p.grad for p in model.parameters()]


def _assert_close(got, want):
    for g, w in zip(got, want):
        assert ((g - w).norm() / w.norm()).item() < 1e-12


class _Capture(torch.optim.SGD):
    def __init__(self, params):
        super().__init__(params, lr=0.0)
        self.grads = None

    def step(self, closure=None):
        self.grads = [p.grad.clone() for g in self.param_groups for p in g["params"]]


@pytest.mark.slow
def test_trainer_on_a_compiled_model_gives_eager_gradients():
    x, y = batch(21, torch.float64)
    model = torch.compile(make(torch.float64))
    opt = _Capture(model.parameters())
    r = memfit.Trainer(model, opt, torch.nn.CrossEntropyLoss(), micro_batch=8).step(x, y)
    assert r.micro_batches == 3 and r.samples == 21
    _assert_close(opt.grads, _eager_gradients(x, y))


@pytest.mark.slow
def test_lazy_on_a_compiled_model_gives_eager_gradients_in_chunks():
    x, y = batch(21, torch.float64)
    model = make(torch.float64)
    compiled = torch.compile(model)
    with memfit.simulated_device("1GiB"):
        xl, yl = memfit.lazy(x, y, batch=0)
        torch.nn.functional.cross_entropy(compiled(xl), yl).backward()
    _assert_close([p.grad for p in model.parameters()], _eager_gradients(x, y))


def test_a_compiled_function_or_a_model_compiled_twice_is_refused_at_the_door():
    # Guards against what was: AttributeError: 'function' object has no attribute 'parameters'.
    def fn(x):
        return (x * 2).sum()

    with pytest.raises(ValueError, match=r"^\[profile\] model is a compiled function, "
                       r"torch.compile\(.*fn\), not an nn.Module: pass the module"):
        memfit.profile(torch.compile(fn), torch.randn(4, 3))
    twice = torch.compile(torch.compile(torch.nn.Linear(3, 2)))
    with pytest.raises(ValueError, match=r"^\[profile\] model is torch.compile of "
                       r"Linear.forward, a model compiled twice"):
        memfit.profile(twice, torch.randn(4, 3))
    with pytest.raises(ValueError, match=r"^\[find_batch_size\] model must be a "
                       r"torch.nn.Module, got str"):
        memfit.find_batch_size("gpt2", torch.randn(4, 3), budget="1GiB")


def test_a_compiled_step_function_is_recorded_warm_without_the_compilers_memory():
    # Guards against what was: profile(model, batch, step=torch.compile(step_fn)) reported
    # the compiler's own 302,717,404 B as the step's peak (7,016 B eager).
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    x = torch.randn(8, 16)

    def step_fn(m, batch):
        return m(batch).square().mean()

    eager = memfit.profile(model, x, step=step_fn).peak_bytes
    compiled = memfit.profile(model, x, step=torch.compile(step_fn)).peak_bytes
    assert 0 < compiled <= 2 * eager, (compiled, eager)


@pytest.mark.parametrize("how", ["torch.compile(model)", "model.compile()"])
def test_the_warm_up_runs_the_forward_alone_and_the_recording_compiles_nothing(how):
    # AOTAutograd compiles each backward at its first call unless told to
    # compile it with the forward: memfit's warm-up tells it, so the warm-up
    # runs the forward alone and the recording's first backward finds its
    # graph compiled (a recording that compiled would be made again: more
    # forwards). Counted by a backend whose compiled graphs count their calls.
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    calls = {"forward": 0, "backward": 0, "compiled backward": 0}

    def counting(kind):
        def compiler(gm, example_inputs):
            if kind == "backward":
                calls["compiled backward"] += 1

            def run(*args):
                calls[kind] += 1
                return gm(*args)
            return make_boxed_func(run)
        return compiler

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=counting("forward"), bw_compiler=counting("backward"))
    if how == "model.compile()":
        model = make()
        model.compile(backend=backend)
    else:
        model = torch.compile(make(), backend=backend)
    report = memfit.profile(model, *batch(B), optimizer="adam", iterations=2)
    assert calls == {"forward": 1 + 2, "backward": 2, "compiled backward": 1}, calls
    assert report.compile.compiled and report.compile.recorded_warm
    assert report.compile.recompiles == []
