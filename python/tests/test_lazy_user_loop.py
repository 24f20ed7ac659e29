"""memfit.lazy inside training loops written the way PyTorch's tutorials and
GPU-memory tip articles write them: AMP with GradScaler,
BatchNorm buffers under OOM recovery, host-resident batches, never worse
than eager, and koila's getting-started example."""

import contextlib
import gc

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memfit
from memfit import _memfit
from test_lazy import (HUGE, OOM, assert_grads_close, device_for_chunks, grads_of, live, no_gc,
                       partition)
from test_trainer_loop import ACCUM, tips_loader, tips_setup

# ---------------------------------------------------------------------------
# AMP: autocast + GradScaler on a lazy loss


def _amp_case():
    # 32 wide: its chunks need oneDNN's bf16 scratch, see Note [Lazy's fit
    # and oneDNN's bf16 scratch].
    torch.manual_seed(21)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 4))
    X, Y = torch.randn(96, 12), torch.randint(0, 4, (96,))
    return model, X, Y


# Note [Lazy's fit and oneDNN's bf16 scratch]
# On a CPU with native bf16 (avx512_bf16, AMX), torch hands a bf16 matmul
# whose m * k * n is above 16**3 to oneDNN, which allocates a scratch buffer
# (22 KiB for this 32-wide MLP) through the CPU allocator; below that size
# ATen's own kernel allocates none. Lazy's memory fit is measured at 2 and 3
# samples, where the backward matmuls (m * 32 * 32) are below the
# threshold. Before lazy checked its fit on a chunk, the three planned
# 32-sample chunks ran out and were halved to 4 samples (3 OOMs), keeping
# what each failed backward had accumulated (Note [Why a retried chunk never
# counts twice]): the hand split over the completed chunks was then another
# sum of bf16-rounded partial gradients (off by 0.3%). Now the calibration
# run below records its whole-batch chunk, which takes the scratch, and the
# fit is raised by it (Note [A fit checked on a chunk], run/chunking.py):
# the planned chunks fit on both ISAs (checked: 3 chunks, 0 OOMs, each step;
# with ONEDNN_MAX_CPU_ISA=AVX2 there is no scratch at all). The test checks
# GradScaler against the hand split, so it asserts that no chunk ran out.


def _amp_steps(model, batches, steps=2, around=contextlib.nullcontext):
    """The recipe of torch's AMP tutorial; batches(step) -> list of (x, y,
    weight) whose losses are accumulated before each optimizer step; each
    backward runs inside around()."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    assert scaler.is_enabled()
    grads = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        for x, y, w in batches(step):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
                if w != 1:
                    loss = loss * w
            scaled = scaler.scale(loss)
            with around():
                scaled.backward()
        grads.append(grads_of(model))
        scaler.step(opt)
        scaler.update()
    return grads, [p.detach().clone() for p in model.parameters()], scaler.get_scale()


# Note [How far bf16 chunks are from the whole batch]
# Under bf16 autocast each weight gradient is a bf16 matmul over the
# samples: the kernel accumulates in fp32 and rounds the sum once to bf16
# (relative error u = 2**-8 = 3.9e-3); .grad adds in fp32. The whole batch
# rounds its 96-sample sum S once, three chunks round their partial sums S_i
# and add them, so per entry |chunks - whole| <= u * (sum_i |S_i| + |S|).
# The chunk weights c_i/B and the scale 2**10 are the same fp32 factors in
# both (products by powers of two, exact). On this data sum_i |S_i| is at
# most 1.4 * max|S| (measured), so the bound is 2.4u = 9.4e-3 of max|S|;
# 2e-2 (5u) leaves 2.6u for per-sample terms a kernel rounds differently at
# 32 rows than at 96. Measured: at most 3.9e-3 (one u), with and without
# ONEDNN_MAX_CPU_ISA=AVX2.


@pytest.mark.numerics
def test_gradscaler_scales_a_lazy_loss_and_the_amp_recipe_gives_eager_parameters():
    model, X, Y = _amp_case()
    start = [p.detach().clone() for p in model.parameters()]

    def reset():
        with torch.no_grad():
            for p, s in zip(model.parameters(), start):
                p.copy_(s)

    want_grads, want, want_scale = _amp_steps(model, lambda s: [(X, Y, 1)])
    x, y = memfit.lazy(X, Y)
    assert isinstance(x, torch.Tensor) and torch.is_tensor(x)
    assert type(x) is memfit.LazyTensor and not isinstance(x, nn.Parameter)

    # one chunk: exactly eager
    reset()
    got_grads, got, got_scale = _amp_steps(model, lambda s: [(*memfit.lazy(X, Y), 1)])
    assert got_scale == want_scale
    for g, w in zip(got_grads[0] + got_grads[1] + got, want_grads[0] + want_grads[1] + want):
        assert torch.equal(g, w)

    # three chunks: the gradients of the tutorial's accumulation over the same
    # micro-batches (loss * c_i/B each), bit for bit: each chunk hands the
    # kernels what the hand split does (same ops, dtypes, shapes and strides
    # under a TorchDispatchMode log), and chunk weights and the scale are
    # applied in another order only where the product is exact (2**10 * w).
    # That holds only when no chunk ran out of memory: a retried chunk keeps
    # the gradients its failed backward accumulated (Note [Why a retried
    # chunk never counts twice]), summed over other micro-batches.
    reset()
    model.zero_grad(set_to_none=True)
    with memfit.simulated_device(HUGE):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            x, y = memfit.lazy(X, Y)
            loss = F.cross_entropy(model(x), y)
        torch.amp.GradScaler("cpu").scale(loss).backward()
    run = memfit.last_lazy_run()
    model.zero_grad(set_to_none=True)
    runs = []

    @contextlib.contextmanager
    def three_chunks():
        with device_for_chunks(run, 3, 96):
            yield
        runs.append(memfit.last_lazy_run())

    got_grads, got, got_scale = _amp_steps(model, lambda s: [(*memfit.lazy(X, Y), 1)],
                                           around=three_chunks)
    for r in runs:
        assert r.ooms == 0 and len(r.chunks) == 3, r
        partition(r.chunks, 96)
    reset()
    parts = [[(X[s:s + n], Y[s:s + n], n / 96) for s, n in r.chunks] for r in runs]
    hand_grads, hand, hand_scale = _amp_steps(model, lambda s: parts[s])
    assert got_scale == hand_scale
    for g, w in zip(got_grads[0] + got_grads[1] + got, hand_grads[0] + hand_grads[1] + hand):
        assert torch.equal(g, w)
    # The full batch's, within bf16: see Note [How far bf16 chunks are from the
    # whole batch].
    for g, w in zip(got_grads[0], want_grads[0]):
        assert (g - w).abs().max() <= 2e-2 * w.abs().max()
    model.zero_grad(set_to_none=True)


def test_help_shows_the_amp_recipe():
    doc = memfit.lazy.__doc__
    for words in ("GradScaler", "scaler.scale(loss).backward()", "scaler.step(", "scaler.update()",
                  "autocast"):
        assert words in doc, words


# ---------------------------------------------------------------------------
# a chunk that runs out of memory leaves no trace in the buffers


class RunningSum(nn.Module):
    """A forward that writes buffers, as BatchNorm's does: a running sum of
    what it sees and a count of calls (like num_batches_tracked)."""

    def __init__(self, n):
        super().__init__()
        self.register_buffer("total", torch.zeros(n))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.total += x.detach().sum(0)
        self.calls += 1
        return x


def _buffers(model):
    return {k: b.clone() for k, b in model.named_buffers()}


def _set_buffers(model, values):
    with torch.no_grad():
        for k, b in model.named_buffers():
            b.copy_(values[k])


@pytest.mark.slow
def test_a_chunk_that_runs_out_of_memory_leaves_no_trace_in_buffers_at_any_allocation(no_gc):
    torch.manual_seed(22)
    n = 12
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), RunningSum(16), nn.ReLU(),
                          nn.Linear(16, 4))
    model[1].train()  # warm its running statistics, then freeze them
    with torch.no_grad():
        model[1](torch.randn(32, 16))
    model.eval()
    X = torch.randn(n, 8)
    start = _buffers(model)
    model(X).pow(2).sum().backward()
    want = grads_of(model)
    model.zero_grad(set_to_none=True)
    with memfit.simulated_device(HUGE):
        model(memfit.lazy(X)).pow(2).sum().backward()
    run = memfit.last_lazy_run()
    struck = 0
    for arm in range(0, 60):
        _set_buffers(model, start)
        model.zero_grad(set_to_none=True)
        loss = model(memfit.lazy(X)).pow(2).sum()
        with device_for_chunks(run, 3, n, collect=False):
            _memfit.fail_allocation_after(arm)
            try:
                loss.backward()
            finally:
                _memfit.fail_allocation_after(0)
        r = memfit.last_lazy_run()
        partition(r.chunks, n)
        struck += r.ooms
        got = _buffers(model)
        # the successful chunks, run by hand
        _set_buffers(model, start)
        with torch.no_grad():
            for s, c in r.chunks:
                model(X[s:s + c])
        for k, b in model.named_buffers():
            assert torch.equal(got[k], b), f"arm={arm} buffer {k}"
        assert int(got["2.calls"]) == len(r.chunks)
        assert_grads_close(grads_of(model), want)
    assert struck >= 20


def test_batchnorm_run_whole_leaves_its_statistics_untouched_when_it_runs_out_of_memory(no_gc):
    torch.manual_seed(23)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    X = torch.randn(10, 6)
    start = _buffers(model)
    model(X).pow(2).mean().backward()
    after_eager = _buffers(model)
    want = grads_of(model)
    struck = 0
    for arm in range(0, 40):
        _set_buffers(model, start)
        model.zero_grad(set_to_none=True)
        loss = model(memfit.lazy(X, allow_mixing=True)).pow(2).mean()
        with memfit.simulated_device(HUGE):
            _memfit.fail_allocation_after(arm)
            try:
                loss.backward()
                failed = False
            except OOM:
                failed = True
            finally:
                _memfit.fail_allocation_after(0)
        struck += failed
        expect = start if failed else after_eager
        for k, b in model.named_buffers():
            assert torch.equal(b, expect[k]), f"arm={arm} buffer {k}"
        if not failed:
            assert_grads_close(grads_of(model), want)
    assert struck >= 5
    model.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------------
# a batch that lives on the host


def _host_case():
    torch.manual_seed(24)
    model = nn.Sequential(nn.Linear(256, 32), nn.ReLU(), nn.Linear(32, 4))
    X, Y = torch.randn(512, 256), torch.randint(0, 4, (512,))  # X: 512 KiB
    return model, X, Y


def test_a_batch_in_host_memory_moves_to_the_device_one_micro_batch_at_a_time():
    model, X, Y = _host_case()
    F.cross_entropy(model(X), Y).backward()
    want = grads_of(model)
    budget = 320 << 10  # the step fits; the batch alone (512 KiB) does not
    model.zero_grad(set_to_none=True)
    with memfit.simulated_device(budget):
        with pytest.raises(OOM):
            X.clone()  # eager: the batch on the device
        with memfit.host_memory():
            Xh, Yh = X.clone(), Y.clone()
        assert live() == 0
        x, y = memfit.lazy(Xh, Yh, device="cpu")
        assert x.device.type == "cpu" and x.shape == (512, 256)
        F.cross_entropy(model(x), y).backward()
    run = memfit.last_lazy_run()
    assert len(run.chunks) > 1
    partition(run.chunks, 512)
    assert_grads_close(grads_of(model), want)
    model.zero_grad(set_to_none=True)


def test_when_the_batch_on_the_device_is_what_does_not_fit_the_message_says_so():
    model, X, Y = _host_case()
    budget = 560 << 10  # the batch (512 KiB) fits, but leaves too little for the step
    with memfit.simulated_device(budget):
        Xd = X.clone()  # on the device
        x, y = memfit.lazy(Xd, Y)
        loss = F.cross_entropy(model(x), y)
        with pytest.raises(OOM, match=r"batch's own data is what does not fit.*512\.00 KiB.*"
                                      r"device=") as e:
            loss.backward()
        assert "memfit.host_memory()" in str(e.value)
        del Xd, x, y, loss, e
        model.zero_grad(set_to_none=True)
        gc.collect()
        x, y = memfit.lazy(X, Y, device="cpu")  # X was made outside the budget: the host's
        F.cross_entropy(model(x), y).backward()
    assert len(memfit.last_lazy_run().chunks) > 1
    model.zero_grad(set_to_none=True)


def test_a_step_too_big_for_the_device_says_the_host_batch_is_not_the_cause():
    model, X, Y = _host_case()
    with memfit.simulated_device(16 << 10):  # below the gradients (33 KiB)
        x, y = memfit.lazy(X, Y, device="cpu")
        loss = F.cross_entropy(model(x), y)
        with pytest.raises(OOM, match=r"batch itself is not the cause: it stays in host memory "
                                      r"and one sample of it takes 1\.0[0-9]* KiB"):
            loss.backward()
    model.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------------
# never worse than eager


def _sweep_models():
    torch.manual_seed(25)
    wide = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))  # its gradients outweigh its activations
    conv = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8),
                         nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
    conv[5].eval()
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    tf = nn.Sequential(nn.TransformerEncoder(layer, 1, enable_nested_tensor=False),
                       nn.Flatten(), nn.Linear(16 * 6, 10))

    class Lstm(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(8, 16, batch_first=False)
            self.head = nn.Linear(16, 10)

        def forward(self, x):
            out, _ = self.lstm(x)
            return self.head(out[-1])

    return {
        "wide_mlp": (wide, torch.randn(32, 64), 0),
        "conv_groupnorm": (conv, torch.randn(32, 3, 8, 8), 0),
        "transformer": (tf, torch.randn(32, 6, 16), 0),
        "lstm": (Lstm(), torch.randn(5, 32, 8), 1),
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", ["wide_mlp", "conv_groupnorm", "transformer", "lstm"])
def test_lazy_succeeds_at_every_budget_where_the_eager_step_fits(name, request):
    model, X, batch = _sweep_models()[name]
    Y = torch.randint(0, 10, (32,))

    def step(x, y):
        out = model(x)  # held during backward, as a training loop holds it
        F.cross_entropy(out, y).backward()
        return out

    gc.collect()
    # The sweep collects garbage some 20 times (here and in lazy's plan),
    # each a walk of every object alive: most of its time in a process that
    # ran earlier tests. Frozen after a collection, what was alive before is
    # left out of each walk; none of it becomes garbage here, so each
    # collection frees the same bytes.
    gc.freeze()
    request.addfinalizer(gc.unfreeze)
    with memfit.track() as t:
        step(X, Y)
    want = grads_of(model)
    peak = t.peak_bytes
    model.zero_grad(set_to_none=True)
    fits = 0
    # From 1.01x: lazy keeps the probe outputs (a few samples) of the lazy
    # tensors the user holds (`out`), a few hundred bytes here.
    for ratio in (0.6, 0.9, 1.01, 1.02, 1.05, 1.1, 1.3, 2.0):
        budget = int(peak * ratio)
        gc.collect()
        try:
            with memfit.simulated_device(budget):
                step(X, Y)
        except OOM:
            continue
        finally:
            model.zero_grad(set_to_none=True)
        fits += ratio <= 1.1
        gc.collect()
        with memfit.simulated_device(budget):
            x, y = memfit.lazy(X, Y, batch=(batch, 0))
            step(x, y)  # must not raise
        assert_grads_close(grads_of(model), want)
        model.zero_grad(set_to_none=True)
    assert fits >= 2  # the budgets just above the eager peak were swept


# ---------------------------------------------------------------------------
# koila's getting-started example


def test_koila_getting_started_example_runs_with_only_the_import_changed(capsys):
    import os
    import runpy

    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                        "koila_getting_started.py")
    example = runpy.run_path(path)
    assert example["main"]() is True
    assert "outputs equal: True; gradients equal: True" in capsys.readouterr().out


def test_eager_and_lazy_values_over_the_full_batch_mix():
    X = torch.randn(9, 4)
    eager_out = X * 2
    lazy_out = memfit.lazy(X) * 2
    # API checks, not tolerances: torch.allclose, Tensor.allclose and torch.equal
    # take a lazy tensor on either side. The values are equal to the bit (x * 2
    # is exact), as torch.equal asserts, or 1 apart: the default tolerances decide nothing.
    assert torch.allclose(eager_out, lazy_out)
    assert eager_out.allclose(lazy_out)
    assert torch.equal(lazy_out, eager_out)
    assert not torch.allclose(eager_out + 1, lazy_out)
    assert torch.allclose(eager_out - lazy_out, torch.zeros(9, 4))


# -- the tip articles' combined loop ---------------------------------------------------

def tips_batches():
    """The effective batches of the tip articles' loop: test_trainer_loop's
    DataLoader (workers, pinned memory), ACCUM of its batches each."""
    batch = []
    for x, y in tips_loader():
        batch.append((x, y))
        if len(batch) == ACCUM:
            yield torch.cat([b[0] for b in batch]), torch.cat([b[1] for b in batch])
            batch = []


@pytest.mark.numerics
def test_the_tip_articles_loop_under_lazy_gives_the_eager_loops_parameters():
    loss_fn = torch.nn.CrossEntropyLoss()

    def lazy_loop(budget):
        model, opt, sched, scaler = tips_setup()
        partitions = []
        for x, y in tips_batches():
            opt.zero_grad(set_to_none=True)
            xl, yl = memfit.lazy(x, y, batch=0)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_fn(model(xl), yl)
            if budget is None:
                scaler.scale(loss).backward()
            else:
                with memfit.simulated_device(budget):
                    scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            sched.step()
            run = memfit.last_lazy_run()
            assert run.ooms == 0, run  # a retried chunk sums other micro-batches
            partitions.append(list(run.chunks))
            del loss, xl, yl
        return model, partitions

    # A budget that forces a split: half of what the whole batch took.
    gc.collect()
    _, whole = lazy_loop(None)
    assert all(len(p) == 1 for p in whole)
    with memfit.track() as t:
        lazy_loop(None)
    model, partitions = lazy_loop(t.peak_bytes // 2)
    assert all(len(p) > 1 for p in partitions), partitions

    # The eager loop, as the tips write it, accumulating the same chunks, bit
    # for bit: each chunk runs the eager chunk's kernels on the same shapes
    # (under bf16 autocast another split rounds differently: see Note [How far
    # bf16 chunks are from the whole batch]).
    ref, opt, sched, scaler = tips_setup()
    for (x, y), chunks in zip(tips_batches(), partitions):
        opt.zero_grad(set_to_none=True)
        for start, size in chunks:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_fn(ref(x[start:start + size]), y[start:start + size])
            scaler.scale(loss * (size / x.shape[0])).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
    for p, w in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.detach(), w.detach())
