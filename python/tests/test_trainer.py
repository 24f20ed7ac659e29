import pytest
import torch

import memfit
from memfit.testing.truth import GradientCapture as Capture

B = 21


def small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(B, 8, generator=g), torch.randint(0, 3, (B,), generator=g)


def reference_gradients(model, x, y, loss_fn):
    model.zero_grad(set_to_none=True)
    loss_fn(model(x), y).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def assert_close(got, want):
    # fp32, u = 2**-24: micro-batches regroup each gradient's sum over the
    # B = 21 samples and weight each part once, so |split - whole| <= (B + 1)
    # * u * sum_s |g_s|, and on this data sum_s |g_s| <= 4.5 |sum_s g_s| per
    # parameter (measured): 5.9e-6 relative. Measured 1.7e-7, with and
    # without ONEDNN_MAX_CPU_ISA=AVX2.
    for g, w in zip(got, want):
        assert ((g - w).norm() / w.norm()).item() < 1e-5


@pytest.mark.numerics
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunks", [1, 2, 3, 7])
def test_split_step_gradients_equal_full_batch(reduction, chunks):
    model = small_model()
    x, y = data()
    loss_fn = torch.nn.CrossEntropyLoss(reduction=reduction)
    want = reference_gradients(model, x, y, loss_fn)
    opt = Capture(model.parameters())
    t = memfit.Trainer(model, opt, loss_fn, micro_batch=-(-B // chunks))
    r = t.step(x, y)
    assert r.micro_batches == chunks
    assert r.samples == B
    assert_close(opt.grads, want)
    assert all(p.grad is None for p in model.parameters())


def test_oom_forced_at_every_allocation_is_recovered_exactly():
    model = small_model()
    x, y = data()
    loss_fn = torch.nn.CrossEntropyLoss()
    want = reference_gradients(model, x, y, loss_fn)
    opt = Capture(model.parameters())
    count = memfit._memfit.allocation_count
    # How many tracked allocations the micro-batches make, up to the step.
    at_step = []
    step = opt.step
    opt.step = lambda: (at_step.append(count()), step())
    # Each Trainer's first split step checks the loss and the forward once
    # (an OOM in those reruns skips the check, not the micro-batch): the
    # step counted and failed is its second.
    counting = memfit.Trainer(model, opt, loss_fn, micro_batch=7)
    counting.step(x, y)
    at_step.clear()
    with memfit.track():
        start = count()
        counting.step(x, y)
    opt.step = step
    n = at_step[0] - start
    assert n > 20
    for k in range(1, n + 1):
        t = memfit.Trainer(model, opt, loss_fn, micro_batch=7)
        t.step(x, y)
        with memfit.track():
            memfit._memfit.fail_allocation_after(k)
            r = t.step(x, y)
            memfit._memfit.fail_allocation_after(0)
        assert r.ooms_recovered == 1, k
        assert sum(r.chunks) == B, k
        assert_close(opt.grads, want)


class PerSample(torch.nn.Module):
    """Each sample id owns one weight: with a sum loss, that weight's gradient
    is exactly how many times the sample was counted."""

    def __init__(self, n):
        super().__init__()
        self.count = torch.nn.Parameter(torch.zeros(n))
        self.body = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                        torch.nn.Linear(512, 1))

    def forward(self, ids, x):
        return self.count[ids] + self.body(x).squeeze(1)


@pytest.mark.parametrize("plan", [False, True])
def test_budget_splits_and_counts_every_sample_exactly_once(plan):
    n = 2048
    ids, x = torch.arange(n), torch.randn(n, 256)
    loss_fn = lambda out, _: out.sum()  # noqa: E731
    with memfit.simulated_device("1GiB"):
        model = PerSample(n)
        opt = Capture(model.parameters())
        # What the whole batch needs, then a budget well below it.
        with memfit.track() as t:
            start = t.live_bytes
            memfit.Trainer(model, opt, loss_fn, reduction="sum", plan=False).step((ids, x), ids)
        base = memfit._memfit.tracked_live_bytes()
        budget = base + (t.peak_bytes - start) // 3
        trainer = memfit.Trainer(model, opt, loss_fn, reduction="sum", budget=budget, plan=plan)
        r = trainer.step((ids, x), ids)
    # plan=False: the micro-batch is found by recovering OOMs; planned: it
    # is measured first, and the step recovers none.
    assert (r.ooms_recovered > 0) if not plan else (r.ooms_recovered == 0)
    assert r.micro_batches > 1
    assert r.samples == n and sum(r.chunks) == n
    assert torch.equal(opt.grads[0], torch.ones(n))  # each sample once


def test_batchnorm_is_not_split_unless_allowed():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    t = memfit.Trainer(model, opt, torch.nn.CrossEntropyLoss(), micro_batch=4)
    with pytest.raises(ValueError, match=r"\b1\b.*coupled=allow|coupled=allow"):
        t.step(x, y)
    t = memfit.Trainer(model, opt, torch.nn.CrossEntropyLoss(), micro_batch=4, coupled="allow")
    assert t.step(x, y).micro_batches == 2


def test_optimizer_step_that_cannot_fit_says_so():
    with memfit.simulated_device("1GiB"):
        model = small_model()
    opt = torch.optim.Adam(model.parameters())
    x, y = data()
    # Room for the micro-batches (each one's data copied to the device as it
    # runs), not for Adam's state.
    t = memfit.Trainer(model, opt, torch.nn.CrossEntropyLoss(), budget=3600)
    with pytest.raises(torch.cuda.OutOfMemoryError,
                       match=r"^CUDA out of memory\. \[Trainer::step\] the optimizer step does "
                             r"not fit in the budget of 3\.52 KiB: it ran out in the optimizer "
                             r"step, with optimizer state .* A smaller batch cannot help: keep the "
                             r"optimizer's state on the host \(memfit.offload"):
        t.step(x, y)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda t, x, y: t.step(x[:0], y[:0]), "empty"),
        (lambda t, x, y: t.step(x, y[:5]), "same samples"),
        (lambda t, x, y: t.step(3, y), "expected a tensor"),
    ],
)
def test_bad_input_is_explained(call, message):
    model = small_model()
    t = memfit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.CrossEntropyLoss())
    x, y = data()
    with pytest.raises(ValueError, match=message):
        call(t, x, y)


def test_batch_dim_out_of_range_is_explained():
    model = small_model()
    t = memfit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                       torch.nn.CrossEntropyLoss(), batch_dim=2)
    x, y = data()
    with pytest.raises(ValueError, match="out of range"):
        t.step(x, y)


def mlp():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))


def test_find_batch_size_is_tight_and_safe_on_the_simulated_device():
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(8, 28, 28), torch.randint(0, 10, (8,))
    fit = memfit.find_batch_size(model, x, y, optimizer=opt, budget="48MiB")
    # One whole step verifies the answer: trials counts those steps.
    assert fit.verified and 1 <= fit.trials <= 4 and fit.margin_bytes == 0
    m8 = fit.max_batch // 8 * 8
    assert fit.recommended_batch == (m8 if (fit.max_batch - m8) * 8 <= fit.max_batch else fit.max_batch)

    def run(batch, steps=2):
        with memfit.simulated_device("48MiB"):
            m = mlp()
            o = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
            for s in range(steps):
                xb, yb = torch.randn(batch, 28, 28), torch.randint(0, 10, (batch,))
                t = memfit.Trainer(m, o, torch.nn.CrossEntropyLoss(), split=False)
                t.step(xb, yb)
                del xb, yb

    run(fit.max_batch)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        run(fit.max_batch + max(1, fit.max_batch // 20))


def test_budget_below_the_model_says_so_with_numbers():
    x, y = torch.randn(4, 28, 28), torch.randint(0, 10, (4,))
    with pytest.raises(memfit.DoesNotFit, match=r"before any sample.*parameters 2\.55 MiB.*"
                       r"on the host \(--optimizer adam-offload, memfit.offload.*momentum"):
        memfit.find_batch_size(mlp(), x, y, optimizer="adam", budget="4MiB")
    # Already on the host: no such advice.
    with pytest.raises(memfit.DoesNotFit) as e:
        memfit.find_batch_size(mlp(), x, y, optimizer="adam-offload", budget="2MiB")
    assert "memfit.offload" not in str(e.value)


def test_auto_batch_size_keeps_the_effective_batch_exact():
    model = mlp()
    x, y = torch.randn(4, 28, 28), torch.randint(0, 10, (4,))
    calls = []

    # 7.5 MiB: 1024 does not fit whole, and the accumulating loop's micro-batch
    # (its gradients alive through the later ones) fits 156.
    @memfit.auto_batch_size(1024, model=model, inputs=x, target=y, optimizer="sgd",
                            budget="7.5MiB")
    def train(batch_size, accumulation_steps):
        calls.append((batch_size, accumulation_steps))
        return batch_size * accumulation_steps

    assert train() == 1024
    (micro, steps), = calls
    assert 1024 % micro == 0 and micro < 1024


# -- Bad arguments refused with why; changes after construction followed --


@pytest.mark.parametrize("optimizer, message", [
    (None, r"got None"),
    ("adam", r"got 'adam'"),
])
def test_a_trainer_without_an_optimizer_instance_is_refused(optimizer, message):
    with pytest.raises(ValueError, match=rf"^\[Trainer\] optimizer must be a torch.optim "
                                         rf"optimizer over model.parameters\(\), {message}"):
        memfit.Trainer(small_model(), optimizer, torch.nn.CrossEntropyLoss())


@pytest.mark.parametrize("bad", [2.5, 4.0, True, "4", -1])
def test_a_micro_batch_that_is_not_an_int_is_refused(bad):
    model = small_model()
    with pytest.raises(ValueError, match=r"^\[Trainer\] micro_batch must be an int >= 0"):
        memfit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), micro_batch=bad)


@pytest.mark.parametrize("bad", [0, -8, 12.5, 16.0, True, "16"])
def test_auto_batch_size_refuses_a_starting_batch_that_is_not_a_positive_int(bad):
    x, y = torch.randn(4, 28, 28), torch.randint(0, 10, (4,))
    with pytest.raises(ValueError, match=r"^\[auto_batch_size\] starting_batch_size must be "
                                         r"an int >= 1"):
        memfit.auto_batch_size(bad, model=mlp(), inputs=x, target=y, budget="6MiB")


def test_batchnorm_put_in_eval_mode_after_the_trainer_was_made_is_split():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    t = memfit.Trainer(model, opt, torch.nn.CrossEntropyLoss(), micro_batch=4)
    model[1].eval()  # frozen statistics: the samples no longer mix
    assert t.step(x, y).micro_batches == 2
    model[1].train()
    with pytest.raises(ValueError, match="coupled=allow"):
        t.step(x, y)


def test_parameters_frozen_or_unfrozen_after_the_trainer_was_made_are_followed():
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    seen = []
    opt.register_step_pre_hook(lambda o, a, k: seen.append([p.grad is not None for p in
                                                             model.parameters()]))
    x, y = data()
    t = memfit.Trainer(model, opt, torch.nn.CrossEntropyLoss(), micro_batch=7)
    model[0].requires_grad_(False)
    assert t.step(x, y).micro_batches == 3
    model[0].requires_grad_(True)
    t.step(x, y)
    assert seen == [[False, False, True, True], [True, True, True, True]]
    assert all(p.grad is None for p in model.parameters())  # none left behind


@pytest.mark.parametrize("make, message", [
    (lambda m: m.requires_grad_(False), r"every parameter of the model is frozen"),
    (lambda m: m.register_forward_hook(lambda mod, i, out: out.detach()),
     r"the loss does not require grad"),
], ids=["frozen", "detached"])
def test_a_step_with_nothing_to_train_says_why(make, message):
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    t = memfit.Trainer(model, opt, torch.nn.CrossEntropyLoss())
    make(model)
    with pytest.raises(ValueError, match=rf"^\[Trainer.step\] {message}"):
        t.step(*data())


class Doubling(torch.nn.Module):
    """Writes into its input, as some user forwards do."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x):
        x.mul_(2)
        return self.fc(x)


def test_a_forward_writing_into_its_input_changes_each_sample_once():
    model = Doubling()
    x, y = data()
    want = x * 2
    t = memfit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                       torch.nn.CrossEntropyLoss(), micro_batch=5)
    assert t.step(x, y).micro_batches == 5
    assert torch.equal(x, want)


def oom_once():
    """A loss that runs out of memory the first time, after the forward."""
    calls = []

    def loss_fn(out, y):
        calls.append(1)
        if len(calls) == 1:
            raise torch.cuda.OutOfMemoryError("out of memory (simulated)")
        return torch.nn.functional.cross_entropy(out, y)

    return loss_fn


def test_a_micro_batch_that_wrote_into_its_input_is_not_redone_after_an_oom():
    x, y = data()
    plain = small_model()
    t = memfit.Trainer(plain, torch.optim.SGD(plain.parameters(), lr=0.1), oom_once())
    assert t.step(x, y).ooms_recovered == 1  # redone: nothing was written

    model = Doubling()
    t = memfit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), oom_once())
    with pytest.raises(ValueError, match=r"^\[Trainer.step\] samples 0\.\.20 ran out of memory "
                                         r"after the forward or loss wrote into them in place"):
        t.step(x, y)


def test_a_micro_batch_plan_that_fails_says_why(monkeypatch):
    # Guards against what was: the plan's error was kept in trainer.planned.failed
    # only, and the whole batch ran without a word.
    import memfit.train.trainer as trainer_module

    def broken_profile(*args, **kwargs):
        raise RuntimeError("the rehearsal broke")

    monkeypatch.setattr(trainer_module, "profile", broken_profile)
    with memfit.simulated_device("1GiB"):
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        trainer = memfit.Trainer(model, opt, torch.nn.functional.mse_loss, budget="512MiB")
        with pytest.warns(RuntimeWarning, match=r"^\[Trainer.step\] the micro-batch for 16 "
                          r"samples was not planned \(RuntimeError: the rehearsal broke\)"):
            r = trainer.step(torch.randn(16, 8), torch.randn(16, 1))
    assert r.samples == 16
    assert trainer.planned.failed == "RuntimeError: the rehearsal broke"


def test_a_model_on_the_meta_device_is_refused_at_the_door():
    # Guards against what was: Tensor.item() cannot be called on meta tensors, from inside step.
    with torch.device("meta"):
        model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"^\[Trainer\] Linear is on the meta device \(shapes, "
                       r"no data\): a step cannot train it. Plan on meta with memfit.advise"):
        memfit.Trainer(model, opt, torch.nn.functional.mse_loss)


def test_a_plan_whose_rehearsal_ran_out_gives_the_figures_not_the_allocators_advice(monkeypatch):
    import memfit.train.trainer as trainer_module

    def oom_profile(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.53 MiB (memfit "
                                     "simulated cpu device: budget 4.00 MiB; 1.44 MiB free). "
                                     "Use a smaller batch, or let memfit find one that fits.")

    monkeypatch.setattr(trainer_module, "profile", oom_profile)
    with memfit.simulated_device("1GiB"):
        model = torch.nn.Linear(8, 1)
        trainer = memfit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                 torch.nn.functional.mse_loss, budget="512MiB")
        with pytest.warns(RuntimeWarning) as seen:
            trainer.step(torch.randn(16, 8), torch.randn(16, 1))
    text = str(seen[0].message)
    assert "(OutOfMemoryError: the rehearsal ran out of memory: Tried to allocate 1.53 MiB" in text
    assert "Use a smaller batch" not in text, text
