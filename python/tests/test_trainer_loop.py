"""The Trainer inside the user's own training loop: AMP's
GradScaler, BatchNorm under a recovered OOM, inputs shared by every sample,
batches kept on the host."""

import gc

import pytest
import torch

import memfit
from memfit.testing.truth import GradientCapture as Capture

B = 21


def data(n=B, features=8, classes=3):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, features, generator=g), torch.randint(0, classes, (n,), generator=g)


def small_model(norm=False):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 16)]
    if norm:
        layers.append(torch.nn.BatchNorm1d(16))
    layers += [torch.nn.Tanh(), torch.nn.Linear(16, 3)]
    return torch.nn.Sequential(*layers)


def clone_state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_states_equal(got, want):
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k


# -- item 1: GradScaler ----------------------------------------------------------------


def amp_eager(model, opt, scaler, x, y, chunks):
    """PyTorch's AMP recipe with gradient accumulation over `chunks`."""
    loss_fn = torch.nn.CrossEntropyLoss()
    opt.zero_grad(set_to_none=True)
    start = 0
    for n in chunks:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(model(x[start:start + n]), y[start:start + n]) * (n / len(x))
        scaler.scale(loss).backward()
        start += n
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)


@pytest.mark.numerics
@pytest.mark.parametrize("micro_batch, chunks", [(0, [B]), (7, [7, 7, 7])])
def test_trainer_with_grad_scaler_gives_the_eager_amp_recipes_parameters(micro_batch, chunks):
    x, y = data()
    want_model = small_model()
    want_opt = torch.optim.SGD(want_model.parameters(), lr=0.1)
    want_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    assert scaler.is_enabled()
    t = memfit.Trainer(model, opt, torch.nn.CrossEntropyLoss(), micro_batch=micro_batch,
                       scaler=scaler)
    for _ in range(3):
        amp_eager(want_model, want_opt, want_scaler, x, y, chunks)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            r = t.step(x, y)
        assert r.chunks == chunks
    # Bit for bit: each micro-batch runs the eager recipe's kernels on the
    # same samples (r.chunks == chunks), the loss weights n/B and the scale
    # 2**10 meet only in exact products.
    for p, w in zip(model.parameters(), want_model.parameters()):
        assert torch.equal(p, w)
    assert scaler.get_scale() == want_scaler.get_scale()
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.numerics
def test_trainer_reports_the_unscaled_loss_under_a_grad_scaler():
    x, y = data()
    model = small_model()
    want = torch.nn.functional.cross_entropy(model(x), y).item()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    t = memfit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.0),
                       torch.nn.CrossEntropyLoss(), micro_batch=7, scaler=scaler)
    # fp32: 2^16 scales and unscales exactly; what differs is the order of the
    # sum of 21 positive per-sample losses (<= 2 * 20 u) and the weights 7/21
    # (a rounding or two): < 64 u = 2^-18, where a scaled loss is 2^16 off.
    # Measured 0.44 u on AMX and AVX2.
    assert t.step(x, y).loss == pytest.approx(want, rel=2.0**-18)


@pytest.mark.numerics
def test_grad_scaler_skips_the_step_on_an_inf_gradient_as_in_eager():
    x, y = data()
    model = small_model()
    before = clone_state(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=3.0e38)
    t = memfit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                       torch.nn.CrossEntropyLoss(reduction="sum"), micro_batch=7,
                       scaler=scaler)
    t.step(x * 1e3, y)
    assert_states_equal(clone_state(model), before)  # inf found: step skipped
    assert scaler.get_scale() < 3.0e38  # and the scale backed off


# -- item 2: a recovered OOM leaves no trace in the buffers ------------------------------


def by_hand(model, x, y, chunks):
    """The micro-batches run one by one: gradients (mean loss) and buffers."""
    model.zero_grad(set_to_none=True)
    start = 0
    for n in chunks:
        loss = torch.nn.functional.cross_entropy(model(x[start:start + n]), y[start:start + n])
        (loss * (n / len(x))).backward()
        start += n
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.slow
def test_a_recovered_oom_at_every_allocation_leaves_batchnorm_statistics_untouched():
    # 2 micro-batches of 8, or of 4 after an OOM (BatchNorm needs 2 samples).
    x, y = data(16)
    count = memfit._memfit.allocation_count
    model = small_model(norm=True)
    opt = Capture(model.parameters())
    # How many tracked allocations the micro-batches make, up to the step.
    at_step = []
    step = opt.step
    opt.step = lambda: (at_step.append(count()), step())
    with memfit.track():
        start = count()
        memfit.Trainer(model, opt, torch.nn.CrossEntropyLoss(), micro_batch=8,
                       coupled="allow").step(x, y)
    n = at_step[0] - start
    assert n > 20
    for k in range(1, n + 1):
        model = small_model(norm=True)
        t = memfit.Trainer(model, Capture(model.parameters()), torch.nn.CrossEntropyLoss(),
                           micro_batch=8, coupled="allow")
        with memfit.track():
            memfit._memfit.fail_allocation_after(k)
            try:
                r = t.step(x, y)
            finally:
                memfit._memfit.fail_allocation_after(0)
        assert r.ooms_recovered == 1, k
        # The statistics of the micro-batches that ran, each once. Gradients
        # are not compared: an OOM in the backward keeps the shares some
        # parameters received with the failed micro-batch's statistics (see
        # Note [Why a retried micro-batch never counts twice]).
        want = small_model(norm=True)
        by_hand(want, x, y, r.chunks)
        got = clone_state(model)
        assert_states_equal(got, clone_state(want))
        assert int(got["1.num_batches_tracked"]) == len(r.chunks), k


def test_two_micro_batches_with_one_oom_count_batchnorm_twice():
    # The case: 2 micro-batches, 1 OOM recovered after the forward.
    x, y = data(8)
    calls = []

    def loss_fn(out, target):
        calls.append(1)
        if len(calls) == 2:
            raise torch.cuda.OutOfMemoryError("out of memory (simulated)")
        return torch.nn.functional.cross_entropy(out, target)

    model = small_model(norm=True)
    t = memfit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.0), loss_fn,
                       micro_batch=4, coupled="allow", reduction="mean")
    r = t.step(x, y)
    assert r.ooms_recovered == 1 and r.chunks == [4, 2, 2]
    want = small_model(norm=True)
    by_hand(want, x, y, r.chunks)
    assert_states_equal(clone_state(model), clone_state(want))


def test_a_step_that_raises_leaves_the_buffers_as_before():
    x, y = data()
    model = small_model(norm=True)
    before = clone_state(model)

    def loss_fn(out, target):
        raise RuntimeError("user's loss is broken")

    t = memfit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn,
                       micro_batch=7, coupled="allow", reduction="mean")
    with pytest.raises(RuntimeError, match="broken"):
        t.step(x, y)
    assert_states_equal(clone_state(model), before)


# -- item 3: an input shared by every sample --------------------------------------------


class Masked(torch.nn.Module):
    """Takes a batch (B, 8) and a mask (1, 8) shared by every sample."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x, mask):
        return self.fc(x * mask)


def masked_data(n=B):
    x, y = data(n)
    return x, torch.linspace(0.5, 1.5, 8).unsqueeze(0), y


def test_a_shared_input_without_its_batch_dim_is_refused_naming_the_option():
    x, mask, y = masked_data(4)
    with pytest.raises(ValueError, match=r"^\[profile\] the tensors disagree on the batch size "
                                         r"along dimension 0: \[1, 4\].*batch_dim=\(0, None\)"):
        memfit.profile(Masked(), (x, mask), y)


def test_profile_takes_a_per_input_batch_dim():
    x, mask, y = masked_data(4)
    r = memfit.profile(Masked(), (x, mask), y, batch_dim=(0, None))
    assert r.batch == 4
    # The probes resize the batch, not the mask.
    assert r.predict_peak_bytes(64) > r.predict_peak_bytes(4)


def test_find_and_auto_batch_size_take_a_per_input_batch_dim():
    x, mask, y = masked_data(4)
    fit = memfit.find_batch_size(Masked(), (x, mask), y, optimizer="sgd", budget="1MiB",
                                 batch_dim=(0, None))
    assert fit.max_batch > 4
    calls = []

    @memfit.auto_batch_size(64, model=Masked(), inputs=(x, mask), target=y, optimizer="sgd",
                            budget="1MiB", batch_dim=(0, None))
    def train(batch_size, steps):
        calls.append((batch_size, steps))

    train()
    assert calls and calls[0][0] * calls[0][1] == 64


def test_trainer_splits_the_batch_but_not_a_shared_input():
    x, mask, y = masked_data()
    x, mask, model = x.double(), mask.double(), Masked().double()
    want = [g for g in torch.autograd.grad(
        torch.nn.functional.cross_entropy(model(x, mask), y), list(model.parameters()))]
    opt = Capture(model.parameters())
    t = memfit.Trainer(model, opt, torch.nn.CrossEntropyLoss(), batch_dim=(0, None),
                       micro_batch=7)
    assert t.step((x, mask), y).chunks == [7, 7, 7]
    # float64: the 21 samples' gradients summed in another order (<= 2 * 20 u)
    # with weights 7/21 (3 u), times the cancellation |sum of |g_i|| / |sum of
    # g_i| <= 3.7 (measured): < 160 u, 2^-45 = 256 u. Measured 1.7 u on AMX and
    # AVX2; a mask split or dropped is off by O(1).
    for g, w in zip(opt.grads, want):
        assert ((g - w).norm() / w.norm()).item() <= 2.0**-45


@pytest.mark.parametrize("batch_dim, message", [
    ((0,), r"batch_dim has 1 entries but there are 2 inputs"),
    ((None, None), r"marks every input as shared"),
    ((0, "x"), r"each batch_dim entry must be an int or None"),
])
def test_a_bad_per_input_batch_dim_is_explained(batch_dim, message):
    x, mask, y = masked_data()
    model = Masked()
    t = memfit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                       torch.nn.CrossEntropyLoss(), batch_dim=batch_dim)
    with pytest.raises(ValueError, match=message):
        t.step((x, mask), y)


# -- items 4 and 5: a batch on the host; OOMs that name their cause ---------------------


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))


def mnist_batch(n=4096):
    g = torch.Generator().manual_seed(2)
    return torch.randn(n, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_a_batch_on_the_host_is_moved_one_micro_batch_at_a_time_and_fits():
    # `memfit train --model mlp --batch 4096 --budget 16MiB`, in float64 (24.5
    # MiB of inputs) so that the gradients compare to float64's rounding: every
    # byte doubled, and the budget with them.
    with memfit.simulated_device("32MiB"):
        model = mlp().double()
        opt = Capture(model.parameters())
        with memfit.host_memory():
            x, y = mnist_batch()
            x = x.double()
        r = memfit.Trainer(model, opt, torch.nn.CrossEntropyLoss()).step(x, y)
    assert r.samples == 4096 and r.micro_batches > 1
    assert r.peak_bytes <= 32 << 20
    want = mlp().double()
    torch.nn.functional.cross_entropy(want(x), y).backward()
    # float64, u = 2**-53: regrouping 4096 samples' sums is within 4097 u of
    # the sum of |terms|, 4.5e-13 relative even with cancellation of 100x.
    for g, p in zip(opt.grads, want.parameters()):
        assert ((g - p.grad).norm() / p.grad.norm()).item() < 1e-10


def oom_message(trainer, x, y):
    # Not pytest.raises: its ExceptionInfo, kept in the test's frame, would
    # keep the failed step's tensors on the simulated device for later tests.
    try:
        trainer.step(x, y)
    except torch.cuda.OutOfMemoryError as e:
        return str(e)
    pytest.fail("expected an out-of-memory error")


def test_a_batch_on_the_device_that_fills_it_is_named_as_the_cause():
    with memfit.simulated_device("16MiB"):
        model = mlp()
        x, y = mnist_batch()
        t = memfit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                           torch.nn.CrossEntropyLoss())
        msg = oom_message(t, x, y)
    assert msg.startswith("CUDA out of memory. [Trainer::step] even one sample does not fit in "
                          "the budget of 16.00 MiB: it ran out in the "), msg
    assert "with the batch 12.28 MiB, parameters 2.55 MiB" in msg
    assert "keep the batch on the host" in msg
    assert "Use a smaller batch" not in msg


def test_a_model_bigger_than_the_budget_is_not_told_to_use_a_smaller_batch():
    with memfit.simulated_device("4MiB"):
        model = mlp()  # 2.55 MiB of parameters, as much again of gradients
        with memfit.host_memory():
            x, y = mnist_batch(16)
        t = memfit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                           torch.nn.CrossEntropyLoss())
        msg = oom_message(t, x, y)
    assert msg.startswith("CUDA out of memory. [Trainer::step] even one sample does not fit"), msg
    assert "The model alone (parameters and their gradients) exceeds the memory: a smaller " \
           "batch cannot help; use a bigger card, shard the model" in msg
    assert "or use a smaller batch" not in msg


# -- "Done means": the tip articles' loop ------------------------------------------------

MICRO, ACCUM, STEPS = 64, 4, 3


def tips_setup():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=STEPS)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    return model, opt, sched, scaler


def tips_loader():
    g = torch.Generator().manual_seed(5)
    n = MICRO * ACCUM * STEPS
    data = torch.utils.data.TensorDataset(torch.randn(n, 32, generator=g),
                                          torch.randint(0, 10, (n,), generator=g))
    return torch.utils.data.DataLoader(data, batch_size=MICRO, num_workers=2, pin_memory=True)


def micro_step_peak(loss_fn):
    """The peak of the loop's step in micro-batches of MICRO (two steps: the
    second holds the optimizer's state)."""
    model, opt, _, scaler = tips_setup()
    probe = memfit.Trainer(model, opt, loss_fn, micro_batch=MICRO, scaler=scaler)
    x, y = next(iter(tips_loader()))
    x, y = torch.cat([x] * ACCUM), torch.cat([y] * ACCUM)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        peak = max(probe.step(x, y).peak_bytes for _ in range(2))
    # The weights, made before memfit tracked them, are on the device too.
    return peak + sum(p.nbytes for p in model.parameters())


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("plan", [False, True])
def test_the_tip_articles_loop_under_the_trainer_gives_the_eager_loops_parameters(plan):
    loss_fn = torch.nn.CrossEntropyLoss()
    # The eager loop, as the tips write it.
    model, opt, sched, scaler = tips_setup()
    opt.zero_grad(set_to_none=True)
    for i, (x, y) in enumerate(tips_loader()):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y) / ACCUM
        scaler.scale(loss).backward()
        if (i + 1) % ACCUM == 0:
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            sched.step()
    want = [p.detach().clone() for p in model.parameters()]

    def trainer_loop(budget):
        model, opt, sched, scaler = tips_setup()
        t = memfit.Trainer(model, opt, loss_fn, budget=budget, scaler=scaler, plan=plan)
        reports, batch = [], []
        for x, y in tips_loader():
            batch.append((x, y))
            if len(batch) == ACCUM:  # the effective batch, whole
                x, y = torch.cat([b[0] for b in batch]), torch.cat([b[1] for b in batch])
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    reports.append(t.step(x, y))
                sched.step()
                batch = []
        return model, reports

    # The budget: what a step of MICRO samples needs, not two of them.
    assert all(r.chunks == [MICRO * ACCUM] for r in trainer_loop(None)[1])
    budget = micro_step_peak(loss_fn) * 21 // 20
    gc.collect()  # the probe's optimizer state is tracked memory until freed
    model, reports = trainer_loop(budget)
    if plan:
        # The micro-batch is measured before the first step (Note [The first
        # micro-batch from the fit]): the budget forces the split, no step
        # recovers an OOM, and the batch is cut evenly.
        assert all(r.ooms_recovered == 0 for r in reports)
    else:
        assert reports[0].ooms_recovered > 0  # the budget forced the split
    # The budget holds a step of MICRO samples and not more, so the Trainer
    # runs the eager loop's micro-batches: the same kernels on the same
    # shapes, added in the same order, each loss weighted by 1/4 (a power of
    # 2, exact) where the loop divides by ACCUM. The parameters are equal to
    # the bit. (Cut otherwise, bf16's rounding moves the last layer's
    # parameters by about 1e-3 over these 3 steps: measured with chunks of
    # 86, 85, 85.)
    assert all(r.chunks == [MICRO] * ACCUM for r in reports)
    for p, w in zip(model.parameters(), want):
        assert torch.equal(p.detach(), w)
