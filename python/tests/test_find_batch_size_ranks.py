"""find_batch_size under torch.distributed: two ranks (gloo on CPU), each
under its own simulated device, get one answer or one error."""

import pytest
import torch
import torch.distributed as dist

import memfit
from memfit.testing.spawned_ranks import run_cases

# Spawning the two ranks (each imports torch) takes most of 20 s on 2 busy cores.
pytestmark = [pytest.mark.torch_api, pytest.mark.slow]  # see python/tests/conftest.py

WORLD = 2
GROUP_TIMEOUT_S = 60  # a rank left in a collective fails here instead of hanging
DEADLINE_S = 180  # every case, process start-up (spawn imports torch) included
ROOMY, SMALL = "6MiB", "3MiB"  # about 1800 and 900 samples of the MLP below
BELOW_ONE = "140KiB"  # the weights (73 KiB) fit, a step at batch 1 does not: DoesNotFit


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))


def _fit(budget, **kwargs):
    x, y = torch.randn(4, 64 if budget else 63), torch.randn(4, 8)  # no budget: a broken batch
    budget = budget or ROOMY
    with memfit.simulated_device(budget):
        return memfit.find_batch_size(_net(), x, y, loss_fn=torch.nn.MSELoss(), optimizer="sgd",
                                      **kwargs)


def _summary(fit):
    return dict(max_batch=fit.max_batch, recommended_batch=fit.recommended_batch,
                budget_bytes=fit.budget_bytes, verified=fit.verified,
                measured_peak_bytes=fit.measured_peak_bytes, notes=list(fit.notes))


# Each case: the simulated device's budget on each rank. One pair of
# processes runs them in turn (spawning a rank imports torch: seconds).
# None: rank 1's batch does not fit its model (a RuntimeError in the step).
CASES = {"agree": [ROOMY, SMALL], "does_not_fit": [ROOMY, BELOW_ONE], "raises": [ROOMY, None],
         "auto_batch_size": [ROOMY, SMALL], "callback": [ROOMY, SMALL],
         "lengths": [ROOMY, SMALL], "gathered_raises": [False, True]}
BETWEEN = [9, 20, 33, 80, 127]  # lengths between LENGTHS'
LENGTHS = [8, 32, 128]
WHOLE = 1024  # auto_batch_size's batch: alone, rank 0 fits it whole, rank 1 accumulates


def _auto_batch_size(budget):
    x, y = torch.randn(4, 64), torch.randn(4, 8)
    with memfit.simulated_device(budget):
        decorate = memfit.auto_batch_size(WHOLE, model=_net(), inputs=x, target=y,
                                    loss_fn=torch.nn.MSELoss(), optimizer="sgd")
        return dict(micro=decorate(lambda micro, steps: [micro, steps])())


def _callback_batch(budget):
    """The batch a framework's callback sizes (memfit.integrations.api's
    plan_batch, under Lightning's and Hugging Face's callbacks)."""
    from memfit.integrations import api

    batch = (torch.randn(4, 64), torch.randn(4, 8))
    how = api.UserStep(step=lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]),
                       what="Callback")
    with memfit.simulated_device(budget):
        return api.plan_batch(_net(), batch, "sgd", whole=api.LoopStep(how), budget=None,
                              what="Callback").batch_size


def _per_length(budget, **kwargs):
    """A fit per length of a per-token model: between its lengths, at()
    comes from each rank's own lines, and those differ with the budget."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 128),
                                torch.nn.GELU(), torch.nn.Linear(128, 50))
    x = torch.randint(0, 50, (4, 12))
    with memfit.simulated_device(budget):
        fit = memfit.find_batch_size(
            model, x, x.clone(), optimizer="sgd", seq_dim=1, lengths=LENGTHS,
            loss_fn=lambda out, y: torch.nn.functional.cross_entropy(out.flatten(0, 1),
                                                                     y.flatten()), **kwargs)
    return dict(at=[fit.at(n) for n in BETWEEN], measured=[fit.at(n) for n in LENGTHS],
                jumps=[list(g) for g in fit.jumps])


def _gathered_raises(fail):
    from memfit.plan.ranks import gathered_from_ranks

    def local():
        if fail:
            raise ValueError("this rank's check failed")
        return 1
    return gathered_from_ranks(local)[1]


def _case(name, rank, budget):
    if name == "lengths":
        return dict(fit=_per_length(budget), alone=_per_length(budget, across_ranks=False))
    if name == "gathered_raises":
        return _gathered_raises(budget)
    if name == "auto_batch_size":
        return _auto_batch_size(budget)
    if name == "callback":
        return dict(batch=_callback_batch(budget))
    try:
        result = dict(fit=_summary(_fit(budget)))
    except Exception as e:  # noqa: B902: every failure goes back to the test
        result = dict(error=type(e).__name__, message=str(e),
                      cause=type(e.__cause__).__name__ if e.__cause__ else None)
    if "fit" in result:  # the opt-out: this rank alone
        result["alone"] = _summary(_fit(budget, across_ranks=False))
    return result


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Every case of CASES on WORLD spawned ranks: {case: {rank: result}},
    a rank's result None when it did not finish by the deadline (then
    killed)."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    return run_cases(_case, CASES, tmp_path_factory.mktemp("ranks"), world=WORLD,
                     group_timeout_s=GROUP_TIMEOUT_S, deadline_s=DEADLINE_S)


def test_every_rank_gets_the_batch_of_the_rank_with_the_smaller_budget(ranks):
    results = ranks["agree"]
    assert all(r is not None and "fit" in r for r in results.values()), results
    roomy, small = results[0], results[1]
    # Alone, the roomy rank fits more: the agreement is what lowers it.
    assert roomy["alone"]["max_batch"] > small["alone"]["max_batch"]
    for r in (roomy, small):
        assert r["fit"]["max_batch"] == small["alone"]["max_batch"]
        assert r["fit"]["recommended_batch"] == small["alone"]["recommended_batch"]
        assert r["fit"]["verified"]
        assert "rank 1's" in r["fit"]["notes"][-1]
    # Each rank's fit holds its own device's truth at the common batch.
    assert roomy["fit"]["budget_bytes"] > small["fit"]["budget_bytes"]
    assert 0 < roomy["fit"]["measured_peak_bytes"] <= roomy["fit"]["budget_bytes"]
    assert f"this rank's own {roomy['alone']['max_batch']}" in roomy["fit"]["notes"][-1]


def test_a_rank_where_batch_one_does_not_fit_makes_every_rank_raise_naming_it(ranks):
    results = ranks["does_not_fit"]
    for rank, r in results.items():
        assert r is not None, f"rank {rank} did not finish: left waiting in a collective?"
        # DoesNotFit naming rank 1, on both ranks: not the process group's
        # timeout, which raises torch's own error, naming no rank.
        assert r.get("error") == "DoesNotFit", r
        assert "rank 1 " in r["message"] and "rank 0 " not in r["message"], r["message"]
        assert "not even one sample fits" in r["message"]  # the model and its state alone
    assert results[1]["cause"] == "DoesNotFit"  # the failing rank chains its own error
    assert results[0]["cause"] is None


def test_a_rank_whose_step_raises_makes_every_rank_raise_naming_it_and_the_cause(ranks):
    results = ranks["raises"]
    for rank, r in results.items():
        assert r is not None, f"rank {rank} did not finish: left waiting in a collective?"
        assert r.get("error") == "RankFailed", r
        assert "rank 1 " in r["message"] and "rank 0 " not in r["message"], r["message"]
        assert "64" in r["message"] and "63" in r["message"]  # the shapes that did not match


def test_auto_batch_size_gives_every_rank_the_same_micro_batch(ranks):
    results = ranks["auto_batch_size"]
    assert results[0] == results[1], results
    micro, steps = results[0]["micro"]
    assert micro * steps == WHOLE and micro < WHOLE  # rank 1's room, not rank 0's


def test_a_callbacks_batch_is_the_same_on_every_rank(ranks):
    # Lightning's and Hugging Face's callbacks size the batch through
    # plan_batch: under DDP a rank with a larger batch would run fewer
    # steps per epoch and leave the others waiting in an all-reduce.
    results = ranks["callback"]
    agree = ranks["agree"]
    assert results[0] == results[1], results
    # The small rank's room, half the roomy one's: about its own
    # find_batch_size alone (886 here: its verifying step ran out of memory
    # at 902 and the search stepped back; the callback verified 901 in a
    # room 5 KB smaller, the two searches' last steps 2% apart).
    small, roomy = agree[1]["alone"]["max_batch"], agree[0]["alone"]["max_batch"]
    assert 0.9 * small <= results[0]["batch"] <= 1.02 * small < roomy


def test_between_measured_lengths_every_rank_answers_the_smallest_ranks_batch(ranks):
    # A LengthBatchSampler on each rank builds its batches from at(L): ranks
    # whose at(L) differ build different batches, step unevenly, and leave
    # one waiting in DDP's all-reduce.
    results = ranks["lengths"]
    assert all(r is not None and "fit" in r for r in results.values()), results
    roomy, small = results[0], results[1]
    assert roomy["fit"] == small["fit"]
    # Alone the roomy rank answers more, at the lengths measured and between
    # them; together every length answers the small rank's own batch.
    assert all(a > b for a, b in zip(roomy["alone"]["at"], small["alone"]["at"]))
    assert roomy["fit"]["measured"] == small["alone"]["measured"]
    assert roomy["fit"]["at"] == small["alone"]["at"]


def test_what_ranks_share_beside_the_batch_fails_on_every_rank_naming_the_one_that_raised(ranks):
    results = ranks["gathered_raises"]
    for rank, r in results.items():
        assert r is not None, f"rank {rank} did not finish: left waiting in a collective?"
        assert r.get("error") == "RankFailed", r
        assert "rank 1 " in r["message"] and "this rank's check failed" in r["message"]
