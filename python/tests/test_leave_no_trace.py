"""The property: what memfit runs on the side leaves no trace.

profile, find_batch_size and advise rehearse training steps the user did not
take: afterwards the parameters, each .grad (the same tensor, the same
values), the buffers, the optimizer's state and learning rate, the inputs
and the RNG state are exactly as before. Trainer.step and memfit.lazy take
the step the user asked for: afterwards everything is exactly as the eager
step leaves it. Checked over models with existing gradients, BatchNorm
buffers, dropout, a forward that writes into its input, an input that
requires grad, and an LR scheduler attached to the optimizer.
"""

import contextlib
import copy
import itertools

import pytest
import torch

import memfit

B = 12

# Every combination of the model's features, except a forward writing into
# an input that requires grad (autograd refuses that in eager PyTorch too).
FEATURES = ("batchnorm", "dropout", "in_place", "input_grad")
VARIANTS = [
    v for v in (dict(zip(FEATURES, bits)) for bits in itertools.product([False, True], repeat=4))
    if not (v["in_place"] and v["input_grad"])
]


def variant_id(v):
    return "+".join(k for k, on in v.items() if on) or "plain"


class Net(torch.nn.Module):
    def __init__(self, batchnorm, dropout, in_place):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 16)
        self.norm = torch.nn.BatchNorm1d(16) if batchnorm else torch.nn.Identity()
        self.drop = torch.nn.Dropout(0.5) if dropout else torch.nn.Identity()
        self.fc2 = torch.nn.Linear(16, 3)
        self.in_place = in_place

    def forward(self, x):
        if self.in_place:
            x.mul_(2)  # writes into the caller's tensor, as some user code does
        return self.fc2(self.drop(torch.relu(self.norm(self.fc1(x)))))


def setup(v, seed=0):
    """Model, optimizer with state, scheduler, inputs: built the same way for
    every call, so two setups are equal bit for bit. The parameters hold
    gradients (a backward ran after the last step) and the LR has moved."""
    torch.manual_seed(seed)
    model = Net(v["batchnorm"], v["dropout"], v["in_place"])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    def backward():
        loss = torch.nn.functional.cross_entropy(model(torch.randn(B, 6)),
                                                 torch.randint(0, 3, (B,)))
        loss.backward()

    for _ in range(2):
        backward()
        opt.step()
        sched.step()
    backward()
    x = torch.randn(B, 6, requires_grad=v["input_grad"])
    y = torch.randint(0, 3, (B,))
    torch.manual_seed(seed + 1)  # the RNG state the step starts from
    return model, opt, sched, x, y


def snapshot(model, opt, x, y):
    """Everything the user owns, by value, and the identity of each .grad
    (under "grad_objects")."""
    return dict(
        params=[p.detach().clone() for p in model.parameters()],
        grads=[None if p.grad is None else p.grad.clone() for p in model.parameters()],
        grad_objects=[p.grad for p in model.parameters()],
        buffers={k: b.clone() for k, b in model.named_buffers()},
        opt=copy.deepcopy(opt.state_dict()),
        lr=[g["lr"] for g in opt.param_groups],
        inputs=[x.detach().clone(), y.clone()],
        input_grads=[None if x.grad is None else x.grad.clone()],
        rng=torch.get_rng_state(),
    )


def assert_same(got, want, path="state"):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), path
        assert got.dtype == want.dtype and got.shape == want.shape, path
        assert torch.equal(got, want), f"{path} differs"
    elif isinstance(want, dict):
        assert set(got) == set(want), path
        for k in want:
            assert_same(got[k], want[k], f"{path}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{path}[{i}]")
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


def by_value(state):
    return {k: v for k, v in state.items() if k != "grad_objects"}


def assert_untouched(before, model, opt, x, y):
    after = snapshot(model, opt, x, y)
    # The very same .grad tensors, with the same values.
    assert all(a is b for a, b in zip(after["grad_objects"], before["grad_objects"]))
    assert_same(by_value(after), by_value(before))


# -- rehearsals: exactly as before -------------------------------------------------------


@pytest.mark.parametrize("mode", ["cpu", "meta"])
@pytest.mark.parametrize("v", VARIANTS, ids=variant_id)
def test_profile_leaves_no_trace(v, mode):
    model, opt, _sched, x, y = setup(v)
    before = snapshot(model, opt, x, y)
    report = memfit.profile(model, x, y, optimizer=opt, mode=mode)
    report.predict_peak_bytes(64)  # runs the probes at other batch sizes too
    assert_untouched(before, model, opt, x, y)


@pytest.mark.slow
@pytest.mark.parametrize("v", VARIANTS, ids=variant_id)
def test_find_batch_size_leaves_no_trace(v):
    model, opt, _sched, x, y = setup(v)
    before = snapshot(model, opt, x, y)
    # 2 MiB fits some 5,700 samples: the search and its verifying step still
    # rehearse batches hundreds of times B's, at a 30th of 64 MiB's steps.
    assert memfit.find_batch_size(model, x, y, optimizer=opt, budget="2MiB").max_batch > B
    assert_untouched(before, model, opt, x, y)


ALL = dict(batchnorm=True, dropout=True, in_place=True, input_grad=False)


@pytest.mark.parametrize("v", [ALL, dict(ALL, in_place=False, input_grad=True)], ids=variant_id)
def test_advise_leaves_no_trace(v):
    model, opt, _sched, x, y = setup(v)
    before = snapshot(model, opt, x, y)
    memfit.advise(model, x, y, optimizer=opt, repeats=1)
    assert_untouched(before, model, opt, x, y)


# -- steps: exactly as the eager step ------------------------------------------------


def eager_step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("v", VARIANTS, ids=variant_id)
def test_trainer_step_leaves_what_the_eager_step_leaves(v):
    want_model, want_opt, want_sched, want_x, want_y = setup(v)
    eager_step(want_model, want_opt, want_x, want_y)
    want_sched.step()
    want = snapshot(want_model, want_opt, want_x, want_y)

    model, opt, sched, x, y = setup(v)
    trainer = memfit.Trainer(model, opt, torch.nn.CrossEntropyLoss(), budget="256MiB")
    assert trainer.step(x, y).micro_batches == 1
    sched.step()
    assert_same(by_value(snapshot(model, opt, x, y)), by_value(want))


@pytest.mark.slow
@pytest.mark.parametrize("budget", [None, "64MiB"])
@pytest.mark.parametrize("v", VARIANTS, ids=variant_id)
def test_lazy_step_leaves_what_the_eager_step_leaves(v, budget):
    want_model, want_opt, want_sched, want_x, want_y = setup(v)
    torch.nn.functional.cross_entropy(want_model(want_x), want_y).backward()
    want_opt.step()
    want_sched.step()
    want = snapshot(want_model, want_opt, want_x, want_y)

    model, opt, sched, x, y = setup(v)
    # With a budget, memfit measures a chunk's memory on a few samples first.
    with memfit.simulated_device(budget) if budget else contextlib.nullcontext():
        # BatchNorm in training mode mixes samples: lazy runs the step whole.
        lx = memfit.lazy(x, allow_mixing=v["batchnorm"])
        torch.nn.functional.cross_entropy(model(lx), y).backward()
    run = memfit.last_lazy_run()
    assert len(run.chunks) == 1
    assert run.measured == (budget is not None and not v["batchnorm"])
    opt.step()
    sched.step()
    assert_same(by_value(snapshot(model, opt, x, y)), by_value(want))


def test_a_profile_needs_no_second_copy_of_the_weights_on_the_device():
    # The saved weights wait in host memory: inside a simulated device that
    # already holds the model, fitting gives the batch it gives outside.
    def mlp():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 512), torch.nn.ReLU(),
                                   torch.nn.Linear(512, 10))
    x, y = torch.randn(8, 28, 28), torch.randint(0, 10, (8,))
    with memfit.track() as t:
        m = mlp()
        r = memfit.profile(m, x, y, optimizer="adam")
    weights = sum(p.numel() * p.element_size() for p in m.parameters())
    assert t.peak_bytes - r.peak_bytes < weights // 4, (t.peak_bytes, r.peak_bytes, weights)
    # m's weights are tracked and live: on a device they would hold room the
    # fit must leave (the fit verifies by a step, #15). Only the model being
    # fitted is on the device below.
    del m, r
    outside = memfit.find_batch_size(mlp(), x, y, optimizer="adam", budget="12MiB").max_batch
    with memfit.simulated_device("12MiB"):
        inside = memfit.find_batch_size(mlp(), x, y, optimizer="adam").max_batch
    assert inside == outside > 0
