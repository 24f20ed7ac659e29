"""memfit.Trainer's planned micro-batch under DistributedDataParallel: two
ranks (gloo on CPU), each with its own budget, start from one micro-batch,
or every rank raises naming the rank that cannot fit. See Note [One
micro-batch on every rank] (train/trainer.py)."""

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import memfit
from memfit.testing.spawned_ranks import run_cases

# Spawning the two ranks (each imports torch) takes most of the time.
pytestmark = [pytest.mark.torch_api, pytest.mark.slow]  # see python/tests/conftest.py

WORLD = 2
LOCAL = 256  # samples per rank
GROUP_TIMEOUT_S = 60  # a rank left in a collective fails here instead of hanging
DEADLINE_S = 180  # every case, process start-up included
# Alone (float64, the MLP below): 2 MiB runs the 256 samples whole; 800 KiB
# plans micro-batches of 64 (78 fit); 400 KiB does not fit one sample.
CASES = {"agree": ["2MiB", "800KiB"], "does_not_fit": ["2MiB", "400KiB"]}


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 8)).double()


def _global_batch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(WORLD * LOCAL, 64, generator=g, dtype=torch.float64)
    return x, torch.randint(0, 8, (WORLD * LOCAL,), generator=g)


class Capture(torch.optim.SGD):
    """SGD that records the synced gradients it steps with, in host memory
    (the copies take nothing of the budget)."""

    def __init__(self, params):
        super().__init__(params, lr=0.1)
        self.grads = None

    def step(self, closure=None):
        with memfit.host_memory():
            self.grads = [p.grad.clone() for g in self.param_groups for p in g["params"]]
        super().step()


def _step(rank, budget):
    x, y = _global_batch()
    x, y = x[rank * LOCAL:(rank + 1) * LOCAL], y[rank * LOCAL:(rank + 1) * LOCAL]
    model = DDP(_net())
    opt = Capture(model.parameters())
    trainer = memfit.Trainer(model, opt, torch.nn.CrossEntropyLoss(), budget=budget)
    report = trainer.step(x, y)
    return dict(micro_batch=report.micro_batch, micro_batches=report.micro_batches,
                start=report.start_micro_batch, ooms=report.ooms_recovered,
                planned=trainer.planned.micro_batch, max_batch=trainer.planned.max_batch,
                notes=list(trainer.planned.notes), grads=[g.tolist() for g in opt.grads])


def _case(name, rank, budget):
    return _step(rank, budget)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Every case of CASES on WORLD spawned ranks: {case: {rank: result}},
    a rank's result None when it did not finish by the deadline."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    return run_cases(_case, CASES, tmp_path_factory.mktemp("trainer_ranks"), world=WORLD,
                     group_timeout_s=GROUP_TIMEOUT_S, deadline_s=DEADLINE_S)


def _full_batch_gradients():
    """The unsplit single-process step on the global batch (mean loss)."""
    model = _net()
    x, y = _global_batch()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return [p.grad for p in model.parameters()]


def test_ranks_with_different_budgets_start_from_one_planned_micro_batch(ranks):
    results = ranks["agree"]
    assert all(r is not None and "error" not in r for r in results.values()), results
    roomy, small = results[0], results[1]
    assert roomy["planned"] == small["planned"] and 0 < small["planned"] < LOCAL
    for r in (roomy, small):
        assert r["start"] == r["micro_batch"] == r["planned"]
        assert r["micro_batches"] == LOCAL // r["planned"] and r["ooms"] == 0
        assert "rank 1's" in r["notes"][-1], r["notes"]
    # Alone, rank 0 runs its batch whole: the agreement is what split it.
    assert f"this rank's own {LOCAL}" in roomy["notes"][-1]


def test_gradients_of_the_agreed_micro_batches_equal_the_global_batch(ranks):
    results = ranks["agree"]
    want = _full_batch_gradients()
    for r in results.values():
        assert r is not None and "grads" in r, r
        # float64: only the order of the sums differs (micro-batches, ranks).
        for got, w in zip(r["grads"], want):
            got = torch.tensor(got, dtype=torch.float64)
            assert ((got - w).norm() / w.norm()).item() < 1e-10


def test_a_rank_that_cannot_fit_one_sample_makes_every_rank_raise_naming_it(ranks):
    results = ranks["does_not_fit"]
    for rank, r in results.items():
        assert r is not None, f"rank {rank} did not finish: left waiting in a collective?"
        assert r.get("error") == "DoesNotFit", r
        assert "rank 1 " in r["message"] and "rank 0 " not in r["message"], r["message"]
