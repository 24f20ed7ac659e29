"""The Trainer's first micro-batch under a budget comes from find_batch_size's
search, measured with the gradients accumulated, not from running out of
memory: see Note [The first micro-batch from the fit]."""

import gc

import pytest
import torch

import memfit
from test_trainer_loop import mlp as mnist_mlp
from test_trainer_loop import mnist_batch as mnist_batch_of


class Capture(torch.optim.SGD):
    """An optimizer whose step records the accumulated gradients, in host
    memory: the copies take nothing of the budget."""

    def __init__(self, params):
        super().__init__(params, lr=0.0)
        self.grads = None

    def step(self, closure=None):
        with memfit.host_memory():
            self.grads = [p.grad.clone() for g in self.param_groups for p in g["params"]]


def as_args(inputs):
    return inputs if isinstance(inputs, tuple) else (inputs,)


def full_batch_gradients(model, inputs, target, loss_fn):
    model.zero_grad(set_to_none=True)
    loss_fn(model(*as_args(inputs)), target).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def assert_close(got, want, tol=1e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert ((g - w).norm() / w.norm()).item() < tol


# -- the models ---------------------------------------------------------------------------


def tanh_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3))


def tanh_batch(n=96):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def mnist_batch(n=2048):
    return mnist_batch_of(n)


def groupnorm_cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.GroupNorm(4, 16), torch.nn.SiLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.GroupNorm(8, 32),
        torch.nn.SiLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(32, 10))


def image_batch(n=64):
    g = torch.Generator().manual_seed(3)
    return torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g)


class TinyGPT2(torch.nn.Module):
    """Hugging Face's GPT-2 from a config (no weights to load), without
    dropout so that the split step's gradients can equal the whole one's."""

    def __init__(self):
        super().__init__()
        transformers = pytest.importorskip("transformers")
        config = transformers.GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2,
                                         n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        torch.manual_seed(0)
        self.gpt = transformers.GPT2LMHeadModel(config)

    def forward(self, ids):
        return self.gpt(input_ids=ids).logits


def lm_loss(logits, target):
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


def token_batch(n=32, length=32):
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 128, (n, length + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


CE = torch.nn.CrossEntropyLoss()
MODELS = {
    "tanh_mlp": (tanh_mlp, tanh_batch, CE),
    "mnist_mlp": (mnist_mlp, mnist_batch, CE),
    "groupnorm_cnn": (groupnorm_cnn, image_batch, CE),
    "gpt2": (TinyGPT2, token_batch, lm_loss),
}


def budget_that_splits(make, x, y, loss_fn, parts=4, **kwargs):
    """A Trainer budget halfway between the peak of the step in `parts`
    micro-batches and the whole step's: the batch must be split, and
    `parts` micro-batches fit. Measured by the Trainer itself (planning off),
    two steps each, the second holding the optimizer's state."""

    def peak(micro_batch):
        model = make()
        t = memfit.Trainer(model, Capture(model.parameters()), loss_fn,
                           micro_batch=micro_batch, plan=False, **kwargs)
        with memfit.track() as tr:
            start = tr.live_bytes
            reports = [t.step(x, y) for _ in range(2)]
        assert all(r.ooms_recovered == 0 for r in reports)
        weights = sum(p.nbytes for p in model.parameters())
        return tr.peak_bytes - start + weights  # the weights are untracked: on top

    n = len(y)
    whole, split = peak(n), peak(-(-n // parts))
    assert split < whole  # the activations weigh more than a second copy of the gradients
    # The budget is the whole simulated device: what earlier tests left alive
    # and tracked in this process is beside the step, on top of it.
    gc.collect()
    return (whole + split) // 2 + memfit._memfit.tracked_live_bytes("cpu")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_the_first_step_under_a_budget_that_splits_recovers_no_oom(name):
    make, data, loss_fn = MODELS[name]
    x, y = data()
    budget = budget_that_splits(make, x, y, loss_fn)
    model = make()
    want = full_batch_gradients(model, x, y, loss_fn)
    opt = Capture(model.parameters())
    t = memfit.Trainer(model, opt, loss_fn, budget=budget)
    first = t.step(x, y)
    plan = t.planned
    assert plan is not None and plan.failed == "", plan
    assert plan.split is not None and plan.split.verified
    assert first.ooms_recovered == 0
    assert first.micro_batches > 1 and first.samples == len(y)
    assert first.micro_batch == plan.micro_batch <= plan.split.max_batch
    # As many micro-batches as the fit's answer needs, evenly cut.
    assert first.micro_batches == -(-len(y) // plan.split.max_batch)
    assert max(first.chunks) - min(first.chunks) <= 1
    assert_close(opt.grads, want)
    second = t.step(x, y)
    assert second.ooms_recovered == 0 and second.chunks == first.chunks
    assert_close(opt.grads, want)


def planned_room(budget, x, y):
    """The room the Trainer's plan had for one step under `budget`, the
    step run without an OOM."""
    model = mnist_mlp()
    t = memfit.Trainer(model, Capture(model.parameters()), CE, budget=budget)
    r = t.step(x, y)
    assert r.ooms_recovered == 0 and r.samples == len(y)
    return t.planned.room_bytes


def test_tensors_kept_from_a_track_block_are_beside_the_trainers_own_budget():
    # The Trainer's budget on the CPU is a simulated device its steps run on,
    # and that device counts the tracked tensors kept beside the step: so
    # does its plan, and the step then fits.
    x, y = mnist_batch()
    budget = budget_that_splits(mnist_mlp, x, y, CE) * 4  # roomy
    alone = planned_room(budget, x, y)
    with memfit.track():
        kept = torch.zeros(budget // 4, dtype=torch.uint8)
    assert planned_room(budget, x, y) == alone - kept.nbytes
    with memfit.track():
        kept = torch.zeros(budget, dtype=torch.uint8)
    model = mnist_mlp()
    t = memfit.Trainer(model, Capture(model.parameters()), CE, budget=budget)
    with pytest.warns(RuntimeWarning, match="is full already"):
        with pytest.raises(torch.OutOfMemoryError):
            t.step(x, y)


def test_garbage_beside_the_trainers_own_budget_is_collected_before_the_plan():
    # A reference cycle an earlier step left holds its tensor until Python's
    # GC runs; the plan collects it rather than plan around it (or find the
    # device full, as a budget smaller than the garbage did).
    x, y = mnist_batch()
    budget = budget_that_splits(mnist_mlp, x, y, CE) * 4  # roomy
    alone = planned_room(budget, x, y)
    gc.disable()  # no collection but the plan's
    try:
        with memfit.track():
            cycle = {"tensor": torch.zeros(budget, dtype=torch.uint8)}
            cycle["self"] = cycle
        del cycle
        assert planned_room(budget, x, y) == alone
    finally:
        gc.enable()


def test_a_batch_that_fits_whole_runs_whole_after_the_probes_only():
    x, y = mnist_batch()
    budget = budget_that_splits(mnist_mlp, x, y, CE) * 4  # roomy
    model = mnist_mlp()
    t = memfit.Trainer(model, Capture(model.parameters()), CE, budget=budget)
    r = t.step(x, y)
    assert r.ooms_recovered == 0 and r.chunks == [len(y)]
    plan = t.planned
    assert plan.micro_batch == 0 and plan.split is None
    # Question 1 is answered by the probes, unverified: no step at the batch.
    assert not plan.whole.verified and plan.whole.trials == 0
    assert max(p.batch for p in plan.whole.probes) * 4 <= len(y)


@pytest.mark.parametrize("kwargs", [dict(micro_batch=64), dict(split=False), dict(plan=False)])
def test_no_plan_when_the_micro_batch_is_given_or_splitting_or_planning_is_off(kwargs):
    x, y = mnist_batch()
    model = mnist_mlp()
    t = memfit.Trainer(model, Capture(model.parameters()), CE, budget="1GiB", **kwargs)
    t.step(x, y)
    assert t.planned is None


def test_no_plan_without_a_budget_and_one_under_a_simulated_device():
    x, y = tanh_batch()
    model = tanh_mlp()
    t = memfit.Trainer(model, Capture(model.parameters()), CE)
    t.step(x, y)
    assert t.planned is None  # the CPU without a budget: nothing to fit
    with memfit.simulated_device("1GiB"):
        t.step(x, y)
    assert t.planned is not None and t.planned.micro_batch == 0


def test_set_budget_plans_again():
    x, y = mnist_batch()
    budget = budget_that_splits(mnist_mlp, x, y, CE)
    model = mnist_mlp()
    t = memfit.Trainer(model, Capture(model.parameters()), CE, budget=budget * 4)
    assert t.step(x, y).chunks == [len(y)]
    t.set_budget(budget)
    r = t.step(x, y)
    assert r.ooms_recovered == 0 and r.micro_batches > 1
    assert t.planned.micro_batch == r.micro_batch


def test_a_plan_that_cannot_answer_leaves_the_step_to_say_why():
    # Room for the micro-batches, not for Adam's state: even one sample
    # does not fit, and the step's own message says where it ran out.
    with memfit.simulated_device("1GiB"):
        model = tanh_mlp()
    x, y = tanh_batch(21)
    t = memfit.Trainer(model, torch.optim.Adam(model.parameters()), CE, budget=8000)
    try:
        t.step(x, y)
    except torch.cuda.OutOfMemoryError as e:
        message = str(e)
    else:
        pytest.fail("expected an out-of-memory error")
    assert "[Trainer::step]" in message
    assert t.planned.failed.startswith("DoesNotFit: "), t.planned


class Noisy(torch.nn.Module):
    """Dropout (draws from the RNG), BatchNorm (writes running statistics)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.BatchNorm1d(64),
                                        torch.nn.ReLU(), torch.nn.Dropout(0.25),
                                        torch.nn.Linear(64, 3))

    def forward(self, x):
        return self.body(x)


def state_of(model, opt):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
             for i, s in opt.state_dict()["state"].items()})


def test_planning_leaves_no_trace():
    """A planned step leaves exactly what the same step leaves with its
    micro-batch given: the weights, BatchNorm's statistics, Adam's state, the
    RNG (dropout's draws) and the inputs are as if the probes never ran."""
    x, y = tanh_batch(96)
    budget = budget_that_splits(Noisy, x, y, CE, coupled="allow")

    def run(**kwargs):
        model = Noisy()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        # A step before: Adam's state exists when the plan runs.
        memfit.Trainer(model, opt, CE, micro_batch=96, coupled="allow").step(x, y)
        xs, ys = x.clone(), y.clone()
        torch.manual_seed(7)
        t = memfit.Trainer(model, opt, CE, budget=budget, coupled="allow", **kwargs)
        r = t.step(xs, ys)
        assert torch.equal(xs, x) and torch.equal(ys, y)
        assert all(p.grad is None for p in model.parameters())
        return t, r, state_of(model, opt), torch.get_rng_state()

    planned, r, state, rng = run()
    assert planned.planned.micro_batch > 0 and r.ooms_recovered == 0
    _, r2, state2, rng2 = run(micro_batch=planned.planned.micro_batch, plan=False)
    assert r2.chunks == r.chunks
    assert torch.equal(rng, rng2)
    for got, want in zip(state, state2):
        assert got.keys() == want.keys()
        for k in want:
            if torch.is_tensor(want[k]):
                assert torch.equal(got[k], want[k]), k
            else:
                for kk in want[k]:
                    assert torch.equal(torch.as_tensor(got[k][kk]),
                                       torch.as_tensor(want[k][kk])), (k, kk)


def test_even_micro_batch():
    from memfit.train.trainer import even_micro_batch
    assert even_micro_batch(256, 67) == 64
    assert even_micro_batch(256, 64) == 64
    assert even_micro_batch(256, 255) == 128
    assert even_micro_batch(21, 8) == 7
    assert even_micro_batch(10, 1) == 1
    for n in range(1, 60):
        for m in range(1, n + 1):
            e = even_micro_batch(n, m)
            assert e <= m and -(-n // e) == -(-n // m)
