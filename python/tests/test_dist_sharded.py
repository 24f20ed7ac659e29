"""memfit on two gloo ranks whose training shards something:
ZeroRedundancyOptimizer (its step broadcasts the shards) and fully_shard
(FSDP2: DTensor parameters). Each rank under its own simulated device; the
truth is the same wrapped step run plainly there."""

import gc

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import memfit
from memfit._native import tracked_live_bytes
from memfit.testing.spawned_ranks import run_cases
from memfit.testing.truth import plain_steps_run

# Spawning the two ranks (each imports torch) takes most of the time.
pytestmark = [pytest.mark.torch_api, pytest.mark.slow]  # see python/tests/conftest.py

WORLD = 2
GROUP_TIMEOUT_S = 30  # a rank left in a collective fails here instead of hanging
DEADLINE_S = 150  # every case, process start-up included
# Each rank's budget: about 850 and 520 samples of the MLP under DDP with Adam.
CASES = {"zero_fit": ["3MiB", "2MiB"], "zero_trainer": ["3MiB", "2MiB"],
         "fsdp2_refused": ["3MiB", "2MiB"]}
LOCAL = 1024  # the Trainer's samples per rank: more than either budget runs whole


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))


def _zero(params):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, lr=1e-3)


def _batch(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 64, generator=g), torch.randn(n, 8, generator=g)


def _plain_step(model, opt, x, y):
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()


def _state(model, opt):
    """The weights and this rank's optimizer state, copied to the host."""
    with memfit.host_memory():
        weights = [p.detach().clone() for p in model.parameters()]
        state = [t.clone() for s in opt.optim.state.values() for t in s.values()]
    return weights, state, [p.grad is None for p in model.parameters()]


def _same(a, b):
    return (len(a[1]) == len(b[1]) and a[2] == b[2]
            and all(torch.equal(u, v) for u, v in zip(a[0] + a[1], b[0] + b[1])))


def _zero_fit(rank, budget):
    gc.collect()
    budget = memfit.to_bytes(budget)
    with memfit.simulated_device(budget + tracked_live_bytes("cpu")):
        model = DDP(_net())
        opt = _zero(model.parameters())
        _plain_step(model, opt, *_batch(8, rank))  # a step first: the shard's state exists
        before = _state(model, opt)
        fit = memfit.find_batch_size(model, *_batch(4, 2), loss_fn=torch.nn.MSELoss(),
                                     optimizer=opt)
        untouched = _same(before, _state(model, opt))
    del model, opt

    def build():
        model = DDP(_net())
        return model, _zero(model.parameters()), *_batch(fit.max_batch, 3)
    # Both ranks run it (or both fail): an answer above a rank's room leaves
    # the other in DDP's all-reduce, and the group's timeout fails it.
    fits = plain_steps_run(budget, build, _plain_step)
    return dict(max_batch=fit.max_batch, verified=fit.verified, notes=list(fit.notes),
                untouched=untouched, fits=fits)


def _zero_trainer(rank, budget):
    model = DDP(_net().double())
    opt = _zero(model.parameters())
    trainer = memfit.Trainer(model, opt, torch.nn.MSELoss(), budget=budget)
    x, y = _batch(LOCAL, 10 + rank)
    report = trainer.step(x.double(), y.double())
    with memfit.host_memory():
        weights = torch.cat([p.detach().flatten() for p in model.parameters()])
        every = [torch.empty_like(weights) for _ in range(WORLD)]
        dist.all_gather(every, weights)
    # The plain DDP step on the same local batches, whole, from the same weights.
    plain = DDP(_net().double())
    plain_opt = _zero(plain.parameters())
    _plain_step(plain, plain_opt, x.double(), y.double())
    want = torch.cat([p.detach().flatten() for p in plain.parameters()])
    return dict(micro_batch=report.micro_batch, planned=trainer.planned.micro_batch,
                replicas_equal=all(torch.equal(every[0], w) for w in every),
                off_plain=(weights - want).abs().max().item())


def _fsdp2_refused(rank, budget):
    from torch.distributed.fsdp import fully_shard

    model = _net()
    for block in (model[0], model[2]):
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters())
    before = [p.to_local().clone() for p in model.parameters()]
    x, y = _batch(4, 2)
    out = {}
    calls = {"find_batch_size": lambda: memfit.find_batch_size(
                 model, x, y, loss_fn=torch.nn.MSELoss(), optimizer=opt, budget=budget),
             "profile": lambda: memfit.profile(model, x, y, loss_fn=torch.nn.MSELoss(),
                                               optimizer=opt),
             "Trainer": lambda: memfit.Trainer(model, opt, torch.nn.MSELoss(), budget=budget)}
    for name, call in calls.items():
        try:
            call()
            out[name] = "ran"
        except Exception as e:  # noqa: B902: every failure goes back to the test
            out[name] = f"{type(e).__name__}: {e}"
    out["untouched"] = all(torch.equal(a, p.to_local()) for a, p in zip(before, model.parameters()))
    out["state"] = len(opt.state)
    return out


def _case(name, rank, budget):
    return {"zero_fit": _zero_fit, "zero_trainer": _zero_trainer,
            "fsdp2_refused": _fsdp2_refused}[name](rank, budget)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Every case of CASES on WORLD spawned ranks: {case: {rank: result}},
    a rank's result None when it did not finish by the deadline."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    return run_cases(_case, CASES, tmp_path_factory.mktemp("dist_sharded"), world=WORLD,
                     group_timeout_s=GROUP_TIMEOUT_S, deadline_s=DEADLINE_S)


def test_zero_redundancy_optimizer_gets_one_batch_that_plain_steps_run(ranks):
    # ZeroRedundancyOptimizer.step() broadcasts the shards: stepped in each
    # rank's probes, the ranks' searches met in each other's collectives and
    # hung until the group's timeout.
    results = ranks["zero_fit"]
    for rank, r in results.items():
        assert r is not None and "error" not in r, (rank, r)
    roomy, small = results[0], results[1]
    assert roomy["max_batch"] == small["max_batch"] > 0
    assert "rank 1's" in roomy["notes"][-1]
    for r in (roomy, small):
        assert r["verified"] and r["fits"], r
        assert r["untouched"], "the weights, .grad or this rank's optimizer state changed"
        # The parameters other ranks own are in no optimizer here, rightly.
        assert not any("in no optimizer given" in n for n in r["notes"]), r["notes"]


def test_trainer_with_zero_redundancy_optimizer_plans_and_steps_as_plain_ddp(ranks):
    results = ranks["zero_trainer"]
    for rank, r in results.items():
        assert r is not None and "error" not in r, (rank, r)
        assert r["replicas_equal"]
        # Split into micro-batches, agreed: both budgets are below the whole.
        assert 0 < r["planned"] < LOCAL and r["micro_batch"] == results[0]["micro_batch"]
        # float64; Adam's first update is lr * g / (|g| + eps): the
        # micro-batches' other summation order moves g by ~1e-16 relative,
        # the weights by far less than 1e-12 (lr 1e-3), and a sample dropped or
        # counted twice moves entries of g by ~1e-3, the weights by ~1e-6.
        assert r["off_plain"] < 1e-12, r["off_plain"]


def test_a_fully_sharded_model_is_refused_in_one_line_on_every_rank(ranks):
    results = ranks["fsdp2_refused"]
    for rank, r in results.items():
        assert r is not None and "error" not in r, (rank, r)
        for what in ("find_batch_size", "profile", "Trainer"):
            line = r[what]
            assert "is a DTensor" in line and "fully_shard" in line, line
            assert "\n" not in line and line.count(f"[{what}]") >= 1, line
        # find_batch_size's refusal goes through the ranks' agreement: both named.
        assert "ranks 0, 1 of 2" in r["find_batch_size"]
        assert r["untouched"] and r["state"] == 0
