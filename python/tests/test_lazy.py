"""memfit.lazy: recorded computations run in chunks that fit, with the
full batch's gradients and values."""

import gc
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memfit
from memfit import _memfit

pytestmark = pytest.mark.torch_api  # see python/tests/conftest.py

OOM = torch.cuda.OutOfMemoryError
HUGE = 1 << 40


# ---------------------------------------------------------------------------
# helpers


def grads_of(model):
    return [p.grad.detach().clone() for p in model.parameters()]


# Note [How close chunked gradients are to the whole batch's]
# Each gradient entry is a sum over the batch, g = sum_s t_s, of N fp32
# terms (u = 2**-24): N = B samples, times the positions a weight is shared
# over (6 tokens in the transformer, 64 pixels in the CNN). Eager adds them
# in one kernel; lazy in n chunk kernels, each chunk's loss weighted by
# c_i/B (a rounding or two per term) and .grad adding the n partial sums
# (n - 1 roundings): two orders of the same sum. Each order errs by at most
# gamma_(N-1) * sum_s |t_s| (Higham, Accuracy and Stability, 4.2), too loose
# to use (190u = 1.1e-5 of sum |t_s| at N = 96 already); round-to-nearest
# errors behave as independent and zero-mean, and a sum then errs by about
# lambda * sqrt(N) * u * sum |t_s| (Higham and Mary 2019), so the two orders
# differ by 2 * lambda * sqrt(N) * u * kappa of the largest entry, kappa =
# sum |t_s| / max |g| (how much the samples' terms cancel). At N = 96,
# lambda = 3, kappa = 1: 59u. Measured over this file's tests: at most 12.5u
# (7.5e-7, the transformer; the CNN 9.8u). What the check must catch is a
# wrong weight, a sample dropped or counted twice, a stale .grad: a whole
# term or more, of the order of 1/B of an entry (1e-3 at the largest batch
# here, 1024). rel = 1e-5 (168u) sits between: 13x the largest rounding
# measured, about 100x below such a mistake.


def assert_grads_close(got, want, rel=1e-5):
    """got equals want up to fp32 rounding: see Note [How close chunked
    gradients are to the whole batch's]."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        scale = max(w.abs().max().item(), 1e-30)
        err = (g - w).abs().max().item()
        assert err <= rel * scale, f"relative error {err / scale:.2e} > {rel:.0e}"


def live():
    return _memfit.tracked_live_bytes("cpu")


def partition(chunks, B):
    """The chunks cover [0, B) once each, in order."""
    pos = 0
    for start, size in chunks:
        assert start == pos and size >= 1
        pos += size
    assert pos == B


def budget_for_chunks(run, n, B, probe_bytes, tight=True):
    """A budget under which memfit plans n chunks, from the fit a
    calibration run measured: a little above the least available memory
    whose chunk limit gives n balanced chunks (memfit itself holds a few
    bytes, e.g. a target count, when it plans), or the middle of the range
    when not `tight`."""

    def least_available(limit):  # least available memory reaching `limit`
        lo, hi = 0, 1 << 34
        while lo < hi:
            mid = (lo + hi) // 2
            if run.limit_for(mid) >= limit:
                hi = mid
            else:
                lo = mid + 1
        return lo

    low = least_available(math.ceil(B / n))
    high = least_available(math.ceil(B / (n - 1))) if n > 1 else low
    return probe_bytes + low + (min(256, (high - low) // 2) if tight else (high - low) // 2)


def device_for_chunks(run, n, B, collect=True):
    """A simulated device on which memfit plans n chunks for the computation
    `run` measured, given what is allocated now (call it just before
    backward(): earlier lazy tensors still hold their probes)."""
    if collect:
        gc.collect()  # garbage of earlier tests (tracebacks...) must not be freed midway
    return memfit.simulated_device(budget_for_chunks(run, n, B, live(), tight=False))


@pytest.fixture(autouse=True, scope="module")
def _frozen_heap():
    """The module's 34 or so collections (no_gc's and lazy's plans') each
    walk every object alive: most of its time in a process that ran earlier
    tests. What was alive before the module is collected once and frozen,
    left out of those walks; none of it becomes garbage here (what the
    tests make is not frozen), so each collection frees the same bytes."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture
def no_gc():
    """Collect garbage once, then keep the collector from freeing tracked
    memory in the middle of a measured loop."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


# ---------------------------------------------------------------------------
# the models of the acceptance criteria: each returns (modules, make_inputs,
# step(x, y) -> loss), where x, y may be lazy.

B = 96


def mlp_case():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 5))
    X, Y = torch.randn(B, 16), torch.randint(0, 5, (B,))
    crit = nn.CrossEntropyLoss()
    return model, (X, Y), 0, lambda x, y: crit(model(x), y)


def cnn_case():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 4 * 4, 5))
    X, Y = torch.randn(B, 3, 8, 8), torch.randint(0, 5, (B,))
    return model, (X, Y), 0, lambda x, y: F.cross_entropy(model(x), y)


def transformer_case():
    torch.manual_seed(3)
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32,
                                       dropout=0.0, batch_first=True)
    enc = nn.TransformerEncoder(layer, num_layers=2)
    head = nn.Linear(16, 5)
    model = nn.ModuleList([enc, head])
    X, Y = torch.randn(B, 6, 16), torch.randint(0, 5, (B,))
    return model, (X, Y), 0, lambda x, y: F.cross_entropy(head(enc(x).mean(1)), y)


def lstm_batch_first_case():
    torch.manual_seed(4)
    lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
    head = nn.Linear(16, 5)
    model = nn.ModuleList([lstm, head])
    X, Y = torch.randn(B, 7, 8), torch.randint(0, 5, (B,))

    def step(x, y):
        out, (h, c) = lstm(x)
        return F.cross_entropy(head(out[:, -1]), y)

    return model, (X, Y), 0, step


def lstm_seq_first_case():
    torch.manual_seed(5)
    lstm = nn.LSTM(8, 16, num_layers=1)
    head = nn.Linear(16, 5)
    model = nn.ModuleList([lstm, head])
    X, Y = torch.randn(7, B, 8), torch.randint(0, 5, (B,))

    def step(x, y):
        out, _ = lstm(x)
        return F.cross_entropy(head(out[-1]), y)

    return model, (X, Y), (1, 0), step


CASES = {
    "mlp": mlp_case,
    "cnn": cnn_case,
    "transformer_encoder": transformer_case,
    "lstm_batch_first": lstm_batch_first_case,
    "lstm_seq_first": lstm_seq_first_case,
}
_calibrated = {}


def calibrated(name):
    """A case, its eager full-batch gradients (no budget), and a calibration
    run (the fit memfit measured, the bytes the recording itself holds)."""
    if name not in _calibrated:
        model, (X, Y), batch, step = CASES[name]()
        model.zero_grad(set_to_none=True)
        step(X, Y).backward()
        ref = grads_of(model)
        model.zero_grad(set_to_none=True)
        with memfit.simulated_device(HUGE):
            x, y = memfit.lazy(X, Y, batch=batch)
            loss = step(x, y)
            probe_bytes = live()
            loss.backward()
        run = memfit.last_lazy_run()
        assert run.measured and run.chunks == [(0, B)]
        _calibrated[name] = (model, X, Y, batch, step, ref, run, probe_bytes)
    return _calibrated[name]


# ---------------------------------------------------------------------------
# acceptance: eager OOMs under the budget, lazy completes with equal gradients


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("chunks", [2, 3, 8])
@pytest.mark.parametrize("name", list(CASES))
def test_lazy_step_fits_budget_where_eager_ooms_and_gradients_equal_eager(name, chunks):
    model, X, Y, batch, step, ref, run, probe_bytes = calibrated(name)
    assert probe_bytes > 0
    budget = budget_for_chunks(run, chunks, B, 0)

    model.zero_grad(set_to_none=True)
    with memfit.simulated_device(budget):
        with pytest.raises(OOM):
            step(X, Y).backward()
    model.zero_grad(set_to_none=True)
    gc.collect()  # what earlier steps left (an LSTM step's cycles) is not this recording's

    with memfit.simulated_device(budget):
        x, y = memfit.lazy(X, Y, batch=batch)
        loss = step(x, y)
        assert live() == 0  # shapes of a step already seen come from the probe cache
        loss.backward()
    got = memfit.last_lazy_run()
    assert got.ooms == 0
    assert len(got.chunks) == chunks
    partition(got.chunks, B)
    assert_grads_close(grads_of(model), ref)
    # the loss value is the full batch's, and reading it runs nothing more
    with torch.no_grad():
        want = step(X, Y).item()
    # A mean of B = 96 non-negative fp32 losses, in chunks weighted by their
    # share: two orders of one sum with nothing to cancel, within (B + n) u
    # = 6e-6 of it (Higham 4.2). Measured 1.2-2.4 u on the MLP's cases.
    assert loss.item() == pytest.approx(want, rel=1e-5)
    model.zero_grad(set_to_none=True)  # tracked memory: leave none to later tests


@pytest.mark.numerics
def test_sgd_steps_with_lazy_follow_the_same_trajectory_as_eager():
    model, X, Y, batch, step, ref, run, probe_bytes = calibrated("mlp")
    budget = budget_for_chunks(run, 3, B, 0)
    twin = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        with memfit.simulated_device(budget):
            loss = step(*memfit.lazy(X, Y))
            loss.backward()
        assert len(memfit.last_lazy_run().chunks) == 3
        opt.step()
        losses.append(loss.item())
    lazy_params = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p, t in zip(model.parameters(), twin):
            p.copy_(t)
    for i in range(3):
        opt.zero_grad(set_to_none=True)
        loss = step(X, Y)
        loss.backward()
        opt.step()
        # The loss as above, (B + n) u = 6e-6, on parameters that differ by
        # lr times each step's gradient rounding (Note [How close chunked
        # gradients are to the whole batch's]): 1.2 u at the first step.
        assert losses[i] == pytest.approx(loss.item(), rel=1e-5)
    assert_grads_close([p.detach() for p in model.parameters()], lazy_params)
    with torch.no_grad():
        for p, t in zip(model.parameters(), twin):
            p.copy_(t)
    model.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------------
# the koila README example


class NeuralNetwork(nn.Module):
    def __init__(self):
        super(NeuralNetwork, self).__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(28 * 28, 512),
            nn.ReLU(),
            nn.Linear(512, 512),
            nn.ReLU(),
            nn.Linear(512, 10),
        )

    def forward(self, x):
        x = self.flatten(x)
        logits = self.linear_relu_stack(x)
        return logits


def test_koila_readme_example_runs_with_only_the_import_changed():
    from memfit import lazy

    torch.manual_seed(0)
    model = NeuralNetwork()
    loss_fn = nn.CrossEntropyLoss()
    # 1024 samples: at 8 a split needs more memory than the whole batch (the
    # accumulating backward's gradient buffers outweigh the activations), and
    # lazy runs it whole: see Note [Never worse than eager].
    raw_input = torch.randn(1024, 28, 28)
    label = torch.randint(0, 10, [1024])
    loss_fn(model(raw_input), label).backward()
    want = grads_of(model)

    for wrap_label in (False, True):
        model.zero_grad(set_to_none=True)
        input = lazy(raw_input, batch=0)
        lbl = lazy(label, batch=0) if wrap_label else label
        loss = loss_fn(model(input), lbl)
        loss.backward()
        assert_grads_close(grads_of(model), want)

    # (input, label) = lazy(input, label, batch=0), and under a budget that
    # forces chunks
    model.zero_grad(set_to_none=True)
    with memfit.simulated_device(HUGE):
        (input, lbl) = lazy(raw_input, label, batch=0)
        loss = loss_fn(model(input), lbl)
        loss.backward()
    run = memfit.last_lazy_run()
    model.zero_grad(set_to_none=True)
    (input, lbl) = lazy(raw_input, label, batch=0)
    loss = loss_fn(model(input), lbl)
    with device_for_chunks(run, 4, 1024):
        loss.backward()
    assert len(memfit.last_lazy_run().chunks) == 4
    assert_grads_close(grads_of(model), want)


# ---------------------------------------------------------------------------
# each sample is counted once, whatever fails


def _one_hot_case(n):
    """Gradients that count samples: sample i is the one-hot vector e_i, the
    model linear with small integer weights and the loss a sum, so every
    gradient is an exact small integer and first.weight.grad[:, i] is
    second.weight times the number of times sample i was counted."""
    torch.manual_seed(6)
    first = nn.Linear(n, 4, bias=False)
    second = nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        first.weight.copy_(torch.randint(-3, 4, (4, n)).float())
        second.weight.copy_(torch.randint(1, 4, (1, 4)).float())
    return nn.Sequential(first, second), torch.eye(n)


def times_counted(model):
    """How many times each sample's gradient was accumulated."""
    return model[0].weight.grad[0] / model[1].weight[0, 0].detach()


def test_each_sample_is_counted_once_when_an_oom_strikes_at_any_allocation(no_gc):
    n = 12
    model, X = _one_hot_case(n)
    (model(X).sum()).backward()
    want = grads_of(model)

    model.zero_grad(set_to_none=True)
    with memfit.simulated_device(HUGE):
        model(memfit.lazy(X)).sum().backward()
    run = memfit.last_lazy_run()

    def lazy_step(arm):
        model.zero_grad(set_to_none=True)
        loss = model(memfit.lazy(X)).sum()
        with device_for_chunks(run, 3, n, collect=False):
            base = live()
            _memfit.fail_allocation_after(arm)
            try:
                loss.backward()
            finally:
                _memfit.fail_allocation_after(0)
            return live() - base, memfit.last_lazy_run(), loss

    clean_growth, clean_run, _ = lazy_step(0)
    assert clean_run.ooms == 0 and len(clean_run.chunks) == 3
    assert torch.equal(times_counted(model), torch.ones(n))
    struck = 0
    for arm in range(1, 60):
        growth, r, loss = lazy_step(arm)
        partition(r.chunks, n)
        assert torch.equal(times_counted(model), torch.ones(n)), f"arm={arm}"
        for g, w in zip(grads_of(model), want):
            assert torch.equal(g, w), f"arm={arm}"
        assert loss.item() == model(X).sum().item()
        # nothing the failed chunk held stays allocated
        assert growth == clean_growth, f"arm={arm}"
        struck += r.ooms
    assert struck >= 20  # the sweep hit forward and backward allocations


def test_oom_in_the_middle_of_backward_redoes_only_the_gradients_still_owed(no_gc):
    n = 12
    model, X = _one_hot_case(n)
    model(X).sum().backward()
    want = grads_of(model)
    model.zero_grad(set_to_none=True)
    with memfit.simulated_device(HUGE):
        model(memfit.lazy(X)).sum().backward()
    run = memfit.last_lazy_run()
    partial = 0
    for arm in range(1, 40):
        model.zero_grad(set_to_none=True)
        loss = model(memfit.lazy(X)).sum()
        seen = []
        hook = model[1].weight.register_hook(lambda g: seen.append(1))
        with device_for_chunks(run, 2, n, collect=False):
            _memfit.fail_allocation_after(arm)
            try:
                loss.backward()
            finally:
                _memfit.fail_allocation_after(0)
        hook.remove()
        for g, w in zip(grads_of(model), want):
            assert torch.equal(g, w), f"arm={arm}"
        r = memfit.last_lazy_run()
        # the last layer's gradient is made first in backward: when the OOM
        # came after it was accumulated, the redo (two halves) left it out
        if r.ooms == 1 and len(seen) == len(r.chunks) - 1:
            partial += 1
    assert partial >= 1


# ---------------------------------------------------------------------------
# reading values


class Counting(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.calls = 0
        self.samples = 0

    def forward(self, x):
        self.calls += 1
        self.samples += x.shape[0]
        return self.inner(x)


def test_item_print_and_held_outputs_do_not_run_the_forward_again():
    torch.manual_seed(7)
    model = Counting(nn.Linear(6, 3))
    X, Y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    x, y = memfit.lazy(X, Y)
    out = model(x)
    loss = F.cross_entropy(out, y)
    model.calls = model.samples = 0
    loss.backward()
    assert (model.calls, model.samples) == (1, 10)
    value = loss.item()
    assert str(loss) == str(torch.tensor(value))
    assert f"{loss:.4f}" == f"{value:.4f}"
    acc = (out.argmax(1) == y).float().mean().item()
    assert model.calls == 1
    with torch.no_grad():
        want_out = model.inner(X)
    assert acc == (want_out.argmax(1) == Y).float().mean().item()
    assert torch.equal(memfit.eager(out), want_out)  # one chunk: the same kernels


def test_values_read_are_concatenated_along_the_batch_dimension_in_chunks():
    torch.manual_seed(8)
    model = Counting(nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4)))
    X = torch.randn(40, 8)
    with torch.no_grad():
        want = model.inner(X)
    with memfit.simulated_device(HUGE), torch.no_grad():
        memfit.eager(model(memfit.lazy(X)) * 2)
    run = memfit.last_lazy_run()
    out = model(memfit.lazy(X)) * 2
    model.calls = model.samples = 0
    with device_for_chunks(run, 5, 40), torch.no_grad():
        got = memfit.eager(out)
    run = memfit.last_lazy_run()
    assert run.kind == "read" and len(run.chunks) == 5
    assert model.samples == 40 and model.calls == 5
    assert got.shape == (40, 4)
    # Equal to the bit here (on AMX and AVX2): each output row is its own
    # dot products. 1e-6 (about 17 u at these O(1) values) leaves room for a
    # BLAS that orders a row's 32-term sums by how many rows it is given.
    assert torch.allclose(got, want * 2, atol=1e-6)
    assert out.tolist() == got.tolist()
    assert model.calls == 5  # cached


def test_a_mean_read_before_backward_is_combined_from_chunks():
    torch.manual_seed(9)
    model = nn.Linear(8, 3)
    X, Y = torch.randn(30, 8), torch.randint(0, 3, (30,))
    with torch.no_grad():
        want = F.cross_entropy(model(X), Y).item()
        x, y = memfit.lazy(X, Y)
        with memfit.simulated_device(HUGE):
            F.cross_entropy(model(x), y).item()
        run = memfit.last_lazy_run()
        loss = F.cross_entropy(model(x), y)
        with device_for_chunks(run, 3, 30):
            got = loss.item()
    assert len(memfit.last_lazy_run().chunks) == 3
    # 30 non-negative fp32 losses in 3 weighted chunk means: two orders of one
    # sum, within (30 + 3) u = 2.0e-6 (1e-6 was below that); measured 1.3 u
    # (7.9e-8) on AMX and AVX2.
    assert got == pytest.approx(want, rel=2**-18)


def test_an_oom_during_a_chunked_read_halves_the_chunk_and_values_stay_exact(no_gc):
    torch.manual_seed(14)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
    X = torch.randn(24, 8)
    with torch.no_grad():
        want = model(X)
        with memfit.simulated_device(HUGE):
            memfit.eager(model(memfit.lazy(X)))
        run = memfit.last_lazy_run()
        struck = escaped = 0
        for arm in range(1, 25):
            out = model(memfit.lazy(X))
            with device_for_chunks(run, 3, 24, collect=False):
                _memfit.fail_allocation_after(arm)
                try:
                    got = memfit.eager(out)
                except OOM:  # the result itself, allocated before any chunk
                    assert memfit.last_lazy_run().chunks == []
                    escaped += 1
                    continue
                finally:
                    _memfit.fail_allocation_after(0)
            r = memfit.last_lazy_run()
            partition(r.chunks, 24)
            struck += r.ooms
            assert torch.allclose(got, want, atol=1e-6), arm  # per-sample rows, as above
    assert struck >= 5 and escaped <= 1


def test_a_batch_interleaved_with_another_dimension_is_read_in_eager_order():
    torch.manual_seed(15)
    X = torch.randn(5, 8, 3)  # (T, B, F): the batch is dimension 1
    x = memfit.lazy(X, batch=1)
    flat = x.reshape(-1, 3)  # rows t*B + b: samples interleaved with time
    assert flat.shape == (40, 3)
    assert torch.equal(memfit.eager(flat * 2), X.reshape(-1, 3) * 2)
    assert "interleaved" in memfit.last_lazy_run().whole
    grouped = x.transpose(0, 1).reshape(-1, 3)  # rows b*T + t: sample by sample
    assert torch.equal(memfit.eager(grouped + 1), X.transpose(0, 1).reshape(-1, 3) + 1)
    assert memfit.last_lazy_run().whole is None


def test_backward_of_a_batched_output_with_a_gradient_runs_in_chunks():
    torch.manual_seed(16)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    X, G = torch.randn(20, 6), torch.randn(20, 3)
    model(X).backward(G)
    want = grads_of(model)
    model.zero_grad(set_to_none=True)
    with memfit.simulated_device(HUGE):
        model(memfit.lazy(X)).backward(G)
    run = memfit.last_lazy_run()
    model.zero_grad(set_to_none=True)
    out = model(memfit.lazy(X))
    with device_for_chunks(run, 4, 20):
        out.backward(G)
    assert len(memfit.last_lazy_run().chunks) == 4
    assert_grads_close(grads_of(model), want)


def test_a_module_whose_output_shape_changes_behind_the_probe_cache_is_caught():
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 6)
            self.keep = 6

        def forward(self, x):
            return self.lin(x)[:, :self.keep]

    head = Head()
    X = torch.randn(8, 4)
    assert head(memfit.lazy(X)).shape == (8, 6)
    head.keep = 3  # the probe cache cannot see this
    stale = head(memfit.lazy(X))
    with pytest.raises(memfit.LazyError, match=r"returned shape \(8, 3\) .* expected"):
        memfit.eager(stale)
    fresh = head(memfit.lazy(X))
    assert fresh.shape == (8, 3)
    assert torch.equal(memfit.eager(fresh), head.lin(X)[:, :3])


# ---------------------------------------------------------------------------
# losses: mean, sum, class weights, ignore_index, several terms


def _chunked_grads(model, make_loss, chunks, n):
    model.zero_grad(set_to_none=True)
    with memfit.simulated_device(HUGE):
        make_loss().backward()
    run = memfit.last_lazy_run()
    model.zero_grad(set_to_none=True)
    loss = make_loss()
    with device_for_chunks(run, chunks, n):
        loss.backward()
    assert len(memfit.last_lazy_run().chunks) == chunks
    return grads_of(model), loss


@pytest.mark.parametrize("kind", ["sum", "class_weights_and_ignore_index", "two_terms_and_l2",
                                  "masked_mean", "mse_on_lazy_target"])
@pytest.mark.numerics
def test_chunk_losses_are_weighted_so_gradients_equal_the_full_batch(kind):
    torch.manual_seed(10)
    n = 30
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    X = torch.randn(n, 8)
    Y = torch.randint(0, 4, (n,))
    Y[:7] = -100  # ignored targets, all in the first chunk
    M = (torch.rand(n, 4) > 0.3).float()
    W = torch.tensor([1.0, 2.0, 0.5, 3.0])

    def loss_of(x, y, m):
        out = model(x)
        if kind == "sum":
            return F.cross_entropy(out, y.clamp(min=0), reduction="sum")
        if kind == "class_weights_and_ignore_index":
            return F.cross_entropy(out, y, weight=W)
        if kind == "two_terms_and_l2":
            l2 = sum(p.pow(2).sum() for p in model.parameters())
            return (F.cross_entropy(out, y.clamp(min=0)) + 0.5 * out.pow(2).mean()
                    + 0.01 * l2) / 2
        if kind == "masked_mean":
            return (out.pow(2) * m).sum() / m.sum()
        return F.mse_loss(out, m)

    loss_of(X, Y, M).backward()
    want = grads_of(model)
    want_loss = loss_of(X, Y, M).item()
    got, loss = _chunked_grads(model, lambda: loss_of(*memfit.lazy(X, Y, M)), 3, n)
    assert_grads_close(got, want)
    # Sums of n = 30 samples' non-negative terms (and a mean of squares) in 3
    # chunks weighted by their share: (n + 3) u = 2.0e-6 for each term, a few
    # u more to add them; measured at most 3.3 u (2.0e-7) on AMX and AVX2.
    assert loss.item() == pytest.approx(want_loss, rel=1e-5)


@pytest.mark.numerics
def test_a_float64_loss_with_ignored_targets_is_weighted_in_float64():
    # A chunk's share of the counted targets is an int64 count over another:
    # divided as tensors that is float32, and a float64 model's gradients
    # were off by the share's rounding (2^-25, 3e-8). In float64 the 3
    # chunks' weighted sums of 30 samples differ from the unsplit batch's by
    # (n + 3) u = 3.7e-15 at most; 1e-13 leaves room for the few additions
    # after, and catches float32's share by 5 orders of magnitude.
    torch.manual_seed(11)
    n = 30
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).double()
    X = torch.randn(n, 8, dtype=torch.float64)
    Y = torch.randint(0, 4, (n,))
    Y[:7] = -100  # the first chunk counts 3 targets of its 10, the others 10

    F.cross_entropy(model(X), Y).backward()
    want = grads_of(model)
    want_loss = F.cross_entropy(model(X), Y)
    def lazy_loss():
        x, y = memfit.lazy(X, Y)
        return F.cross_entropy(model(x), y)

    got, loss = _chunked_grads(model, lazy_loss, 3, n)
    assert loss.dtype == torch.float64
    assert_grads_close(got, want, rel=1e-13)
    assert loss.item() == pytest.approx(want_loss.item(), rel=1e-13)


class _ScratchAboveEightRows(torch.autograd.Function):
    """The identity, whose backward takes a scratch buffer only above 8 rows,
    as oneDNN's bf16 matmul does above m*k*n = 16**3: lazy's fit, measured
    at 2 and 3 samples, cannot see it."""

    @staticmethod
    def forward(ctx, x):
        ctx.rows = x.shape[0]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        scratch = torch.zeros(32 * 1024) if ctx.rows > 8 else None  # 128 KiB
        out = grad.clone()
        del scratch
        return out


class _Scratch(nn.Module):
    def forward(self, x):
        return _ScratchAboveEightRows.apply(x)


def test_a_scratch_buffer_the_fit_cannot_see_is_learned_from_the_first_chunk():
    torch.manual_seed(17)
    model = nn.Sequential(nn.Linear(16, 256), _Scratch(), nn.ReLU(), nn.Linear(256, 4))
    X, Y = torch.randn(96, 16), torch.randint(0, 4, (96,))
    # The calibration run's whole batch takes the scratch; the fit it raises
    # plans the 3 chunks (Note [A fit checked on a chunk]).
    def loss_of(x, y):
        return F.cross_entropy(model(x), y)

    got, _ = _chunked_grads(model, lambda: loss_of(*memfit.lazy(X, Y)), 3, 96)
    run = memfit.last_lazy_run()
    assert run.ooms == 0, run
    model.zero_grad(set_to_none=True)
    for start, n in run.chunks:  # the hand split over the same chunks, bit for bit
        (loss_of(X[start:start + n], Y[start:start + n]) * (n / 96)).backward()
    for g, w in zip(got, grads_of(model)):
        assert torch.equal(g, w)
    model.zero_grad(set_to_none=True)


def test_a_loss_that_is_not_linear_in_the_batch_reduction_is_refused_clearly():
    model = nn.Linear(4, 1)
    x, y = memfit.lazy(torch.randn(6, 4), torch.randn(6, 1))
    loss = F.mse_loss(model(x), y).sqrt()
    with pytest.raises(memfit.LazyError, match=r"Tensor.sqrt.*linearly"):
        loss.backward()
    loss = model(x).max()
    with pytest.raises(memfit.LazyError, match=r"Tensor.max.*sums, means"):
        loss.backward()
    # allowed: runs whole, like eager
    model.zero_grad(set_to_none=True)
    X, Y = torch.randn(6, 4), torch.randn(6, 1)
    F.mse_loss(model(X), Y).sqrt().backward()
    want = grads_of(model)
    model.zero_grad(set_to_none=True)
    x, y = memfit.lazy(X, Y, allow_mixing=True)
    F.mse_loss(model(x), y).sqrt().backward()
    assert memfit.last_lazy_run().chunks == [(0, 6)]
    assert_grads_close(grads_of(model), want)


# ---------------------------------------------------------------------------
# operations koila could not record


def test_reshape_scalar_and_matmul_operators_multihead_attention_and_lstm_record():
    torch.manual_seed(11)
    X = torch.randn(6, 5, 8)
    Wt = torch.randn(8, 8, requires_grad=True)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    lstm = nn.LSTM(8, 8, batch_first=True)

    def compute(x):
        h = x.reshape(x.shape[0], 5, 8) * 2
        h = (h @ Wt) + 1
        a, _ = mha(h, h, h, need_weights=False)
        o, (hn, cn) = lstm(a)
        return o.reshape(x.size(0), -1).sum(1).mean() + hn.sum() / 6

    compute(X).backward()
    want = [Wt.grad.clone()] + grads_of(mha) + grads_of(lstm)
    Wt.grad = None
    mha.zero_grad(set_to_none=True)
    lstm.zero_grad(set_to_none=True)
    x = memfit.lazy(X)
    assert x.shape == (6, 5, 8) and x.size(0) == 6 and len(x) == 6
    loss = compute(x)
    with memfit.simulated_device(HUGE):
        loss.backward()
    assert_grads_close([Wt.grad] + grads_of(mha) + grads_of(lstm), want)
    for zero in range(2):  # a calibration run, then one forced into chunks
        Wt.grad = None
        mha.zero_grad(set_to_none=True)
        lstm.zero_grad(set_to_none=True)
        loss = compute(memfit.lazy(X))
        if zero == 0:
            with memfit.simulated_device(HUGE):
                loss.backward()
            run = memfit.last_lazy_run()
    with device_for_chunks(run, 3, 6):
        loss.backward()
    assert len(memfit.last_lazy_run().chunks) == 3
    assert_grads_close([Wt.grad] + grads_of(mha) + grads_of(lstm), want)


def test_shapes_are_known_without_computing_and_batch_sizes_follow_the_chunk():
    x = memfit.lazy(torch.randn(10, 3, 4))
    y = x.view(x.size(0), -1).unsqueeze(1)
    assert y.shape == (10, 1, 12) and y.dim() == 3 and y.numel() == 120
    assert y.dtype == torch.float32 and y.device.type == "cpu"
    assert isinstance(y.shape[0], memfit.lazy_mode.graph.BatchInt)
    z = x.transpose(0, 1)
    assert z.shape == (3, 10, 4)
    assert torch.equal(memfit.eager(y.squeeze(1)), memfit.eager(x).reshape(10, 12))


def test_plain_targets_of_loss_functions_are_sliced_with_the_chunk():
    torch.manual_seed(12)
    model = nn.Linear(5, 3)
    X, Y = torch.randn(12, 5), torch.randint(0, 3, (12,))
    F.nll_loss(F.log_softmax(model(X), 1), Y).backward()
    want = grads_of(model)
    got, _ = _chunked_grads(model, lambda: F.nll_loss(F.log_softmax(model(memfit.lazy(X)), 1),
                                                        Y), 4, 12)
    assert_grads_close(got, want)


def test_no_grad_recording_is_honoured_when_computed():
    model = nn.Linear(4, 2)
    with torch.no_grad():
        out = model(memfit.lazy(torch.randn(5, 4)))
    assert not out.requires_grad
    assert not memfit.eager(out).requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        out.sum().backward()


def test_a_single_sample_and_constants_are_computed_at_once():
    model = nn.Linear(3, 2)
    X, W = torch.randn(1, 3), torch.randn(2)
    model(X).mul(W).sum().backward()
    want = grads_of(model)
    model.zero_grad(set_to_none=True)
    x, w = memfit.lazy(X, W, batch=(0, None))
    loss = model(x).mul(w).sum()
    assert loss._node.state == "eager"
    loss.backward()
    assert memfit.last_lazy_run().chunks == [(0, 1)]
    assert_grads_close(grads_of(model), want)


def test_eager_of_a_result_that_needs_grad_keeps_its_autograd_graph():
    model = nn.Linear(4, 2)
    X = torch.randn(5, 4)
    out = memfit.eager(model(memfit.lazy(X)))
    assert out.requires_grad
    out.sum().backward()
    want = model.weight.grad.clone()
    model.zero_grad(set_to_none=True)
    model(X).sum().backward()
    assert torch.equal(want, model.weight.grad)  # one chunk: the same graph


# ---------------------------------------------------------------------------
# operations that mix samples


def test_batchnorm_in_training_mode_is_refused_naming_the_layer():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU())
    x = memfit.lazy(torch.randn(6, 4))
    with pytest.raises(memfit.LazyError, match=r"BatchNorm1d at '1' in training mode"):
        model(x)
    model.eval()
    model(x).sum().backward()  # eval mode normalizes per sample


def test_batchnorm_runs_whole_when_mixing_is_allowed_and_matches_eager():
    torch.manual_seed(13)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    X = torch.randn(6, 4)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model(X).pow(2).mean().backward()
    want = grads_of(model)
    model.load_state_dict(state)
    model.zero_grad(set_to_none=True)
    x = memfit.lazy(X, allow_mixing=True)
    loss = model(x).pow(2).mean()
    with memfit.simulated_device(HUGE):
        loss.backward()
    run = memfit.last_lazy_run()
    assert run.chunks == [(0, 6)] and "BatchNorm1d" in run.whole
    assert_grads_close(grads_of(model), want)


@pytest.mark.parametrize("op, name", [
    (lambda x: x - x.mean(0), r"Tensor.mean .*reduces over the batch"),
    (lambda x: torch.softmax(x, dim=0), r"torch.softmax along the batch"),
    (lambda x: F.softmax(x, 0), r"F.softmax along the batch"),
    (lambda x: x.cumsum(0), r"Tensor.cumsum along the batch"),
    (lambda x: x[:3], r"indexing the batch dimension"),
    (lambda x: x[0], r"indexing the batch dimension"),
    (lambda x: x.index_select(0, torch.tensor([1, 0])), r"Tensor.index_select picks"),
    (lambda x: x @ x.t(), r"more than one dimension"),
    (lambda x: torch.cat([x, torch.zeros(1, 3)]), r"does not scale"),
])
def test_operations_that_mix_samples_raise_naming_the_operation(op, name):
    x = memfit.lazy(torch.randn(6, 3))
    with pytest.raises(memfit.LazyError, match=name):
        op(x)


def test_per_sample_operations_are_not_mistaken_for_mixing():
    X = torch.randn(6, 3, 4)
    x = memfit.lazy(X)
    ops = [
        lambda t: torch.softmax(t, -1), lambda t: t.mean(1), lambda t: t[:, 0],
        lambda t: t[torch.arange(6), 1], lambda t: t.cumsum(2), lambda t: t.flip(1),
        lambda t: F.layer_norm(t, (4,)), lambda t: t.flatten(0, 1).view(t.size(0), 3, 4),
        lambda t: t.sort(-1).values, lambda t: t.permute(2, 0, 1).reshape(4, -1),
    ]
    for op in ops:
        # Per-sample operations on chunks: the same arithmetic per sample, equal
        # to the bit here; 1e-6 (17 u at O(1) values) leaves room for a kernel
        # that vectorizes a reduction by the whole tensor's shape.
        assert torch.allclose(memfit.eager(op(x)), op(X), atol=1e-6)


def test_lstm_fed_the_batch_on_the_time_dimension_is_refused():
    lstm = nn.LSTM(4, 4)  # batch_first=False: reads (T, N, F)
    x = memfit.lazy(torch.randn(6, 5, 4), batch=0)
    with pytest.raises(memfit.LazyError, match=r"LSTM reads dimension 1 as the batch"):
        lstm(x)


# ---------------------------------------------------------------------------
# bad input


def test_bad_input_gets_a_clear_error():
    t = torch.randn(4, 3)
    with pytest.raises(ValueError, match=r"batch dimension 2 is out of range .*\(4, 3\)"):
        memfit.lazy(t, batch=2)
    with pytest.raises(TypeError, match=r"expected torch.Tensor .*got list"):
        memfit.lazy([1, 2, 3])
    with pytest.raises(ValueError, match=r"0 samples"):
        memfit.lazy(torch.randn(0, 3))
    with pytest.raises(ValueError, match=r"different numbers of samples .*4.*5"):
        memfit.lazy(t, torch.randn(5))
    a, b = memfit.lazy(t), memfit.lazy(torch.randn(5, 3))
    with pytest.raises(memfit.LazyError, match=r"different batch sizes \[4, 5\]"):
        a + b
    plain = torch.randn(4, 3)
    with pytest.raises(memfit.LazyError, match=r"memfit.lazy\(t, batch=0\)"):
        torch.cdist(a, plain)


@pytest.mark.parametrize("mutate", [
    lambda x: x.add_(1),
    lambda x: x.__iadd__(1),
    lambda x: x.__setitem__(0, 1.0),
    lambda x: F.relu(x, inplace=True),
    lambda x: torch.add(x, 1, out=torch.empty(4, 3)),
    lambda x: x.requires_grad_(),
])
def test_in_place_modification_of_a_lazy_tensor_is_refused(mutate):
    x = memfit.lazy(torch.randn(4, 3))
    with pytest.raises(memfit.LazyError, match="in place"):
        mutate(x)


def test_help_explains_what_lazy_does_and_its_limits():
    doc = memfit.lazy.__doc__
    for words in ("backward()", "item()", "chunk", "simulated_device", "c_i/B",
                  "out-of-memory", "BatchNorm", "allow_mixing", "Dropout", "In-place",
                  "Limits"):
        assert words in doc, words
    public = [memfit.eager, memfit.last_lazy_run, memfit.LazyRun, memfit.LazyError,
              memfit.LazyRun.limit_for, memfit.LazyTensor]
    public += [v.fget if isinstance(v, property) else v
               for n, v in vars(memfit.LazyTensor).items() if not n.startswith("_")]
    for fn in public:
        assert fn.__doc__, fn


# ---------------------------------------------------------------------------
# Probes and measurements leave no trace


class Doubling(nn.Module):
    """Writes into its input, as some user forwards do; runs out of memory
    (after the write) on the first `ooms` calls on the full batch."""

    def __init__(self, ooms=0):
        super().__init__()
        self.fc = nn.Linear(6, 3)
        self.ooms = ooms

    def forward(self, x):
        x.mul_(2)
        if self.ooms and x.shape[0] == 12:
            self.ooms -= 1
            raise OOM("out of memory (simulated)")
        return self.fc(x)


@pytest.mark.parametrize("budget", [None, 64 << 20])
def test_probes_and_measurements_do_not_write_into_the_users_tensor(budget):
    model = Doubling()
    x = torch.randn(12, 6)
    want = x * 2
    with memfit.simulated_device(budget) if budget else memfit.track():
        loss = model(memfit.lazy(x)).sum()
        assert torch.equal(x, want / 2)  # the probes wrote into copies
        loss.backward()
    assert memfit.last_lazy_run().measured == (budget is not None)
    assert torch.equal(x, want)  # the step itself: once, as eager


def test_probes_leave_running_statistics_and_the_rng_as_they_were():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Dropout(0.5))
    x = torch.randn(12, 6)
    buffers = {k: b.clone() for k, b in model.named_buffers()}
    rng = torch.get_rng_state()
    memfit.lazy(x, allow_mixing=True)
    model(memfit.lazy(x, allow_mixing=True))  # recorded: only the probes ran
    for k, b in model.named_buffers():
        assert torch.equal(b, buffers[k]), k
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_chunk_that_wrote_into_its_input_is_not_redone_after_an_oom():
    model = Doubling(ooms=1)
    x = torch.randn(12, 6)
    loss = model(memfit.lazy(x)).sum()
    with pytest.raises(memfit.LazyError, match=r"samples 0\.\.11 of the loss .* ran out of "
                                               r"memory after the computation wrote into a lazy "
                                               r"input in place"):
        loss.backward()
