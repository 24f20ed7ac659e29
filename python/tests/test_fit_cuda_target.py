"""find_batch_size for a CUDA card (target_device="cuda", the default for a
model on a CUDA device): each step is held against the budget by the
caching allocator's reserved bytes, replayed on it. In allocated bytes the
answer can be far over a card: on this MLP the CPU answer under the budget
reserves more than it on a card."""

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit.report.profile import DEFAULT_CUDA_WORKSPACE
from test_advise_cuda_target import data, mlp

# The two cuBLAS workspaces a card holds, and 52 MiB for the step.
BUDGET = DEFAULT_CUDA_WORKSPACE + (52 << 20)


def card_reserved(model, x, y, batch):
    r = memfit.profile(model, x[:1].repeat(batch, 1), y[:1].repeat(batch), loss_fn=F.cross_entropy,
                       optimizer="adam", target_device="cuda")
    return r.cuda.peak_reserved


def fit(model, x, y, budget, target_device):
    return memfit.find_batch_size(model, x, y, loss_fn=F.cross_entropy, optimizer="adam",
                                  budget=budget, target_device=target_device)


@pytest.mark.slow
def test_a_card_gets_a_batch_whose_reserved_bytes_fit():
    model = mlp()
    x, y = data()
    on_cpu = fit(model, x, y, BUDGET, "cpu")
    assert card_reserved(model, x, y, on_cpu.max_batch) > BUDGET  # why a card needs its own
    assert not any("CUDA card" in n for n in on_cpu.notes)

    card = fit(model, x, y, BUDGET, "cuda")
    assert card.verified and card.max_batch < on_cpu.max_batch
    reserved = card_reserved(model, x, y, card.max_batch)
    assert card.measured_peak_bytes == reserved <= BUDGET
    assert any(n.startswith("for a CUDA card") for n in card.notes)
    # What the CPU cannot see of a card is said, not hidden.
    assert any(n.startswith("not counted for a CUDA card") and "margin" in n for n in card.notes)


def test_nothing_fits_a_card_says_reserved_and_allocated():
    model = mlp()
    x, y = data()
    one = card_reserved(model, x, y, 1)
    with pytest.raises(memfit.DoesNotFit, match=r"at batch 1 reserves .* on a CUDA card \(.* "
                                                r"allocated.*expandable_segments"):
        fit(model, x, y, one - 1, "cuda")


def test_an_unknown_target_device_is_one_line():
    x, y = data()
    with pytest.raises(ValueError, match=r"target_device must be 'cpu' or 'cuda'.*got 'gpu'"):
        fit(mlp(), x, y, BUDGET, "gpu")


def test_unverified_for_a_card_keeps_the_measured_reserve_free_and_says_so():
    model = mlp()
    x, y = data()
    kwargs = dict(loss_fn=F.cross_entropy, optimizer="adam", budget=BUDGET, verify=False)
    on_cpu = memfit.find_batch_size(model, x, y, target_device="cpu", **kwargs)
    card = memfit.find_batch_size(model, x, y, target_device="cuda", **kwargs)
    assert not card.verified
    assert card.max_batch < on_cpu.max_batch
    assert any(n.startswith("unverified for a CUDA card") and "kept free" in n
               for n in card.notes)


def test_a_card_runs_the_optimizer_a_gpu_would_whether_named_or_given():
    # torch runs Adam foreach on CUDA parameters, per tensor on the CPU: a
    # step recorded for a card runs foreach, for "adam" as for the user's
    # optimizer, whose own setting is put back.
    model = mlp()
    x, y = data()
    given = torch.optim.Adam(model.parameters())
    for opt in ("adam", given):
        card = memfit.profile(model, x, y, loss_fn=F.cross_entropy, optimizer=opt,
                              target_device="cuda")
        cpu = memfit.profile(model, x, y, loss_fn=F.cross_entropy, optimizer=opt)
        assert any("foreach implementation" in n for n in card.notes)
        assert not any("foreach" in n for n in cpu.notes)
        step = [p["peak_bytes"] for p in card.phases if p["name"] == "optimizer_step"]
        assert step != [p["peak_bytes"] for p in cpu.phases if p["name"] == "optimizer_step"]
    assert given.param_groups[0]["foreach"] is None


def true_card_max(model, x, y, budget, start):
    """The largest batch whose replayed reserve fits, scanning up from one
    that does (the reserve rises with this MLP's batch)."""
    b = start
    while card_reserved(model, x, y, b + 1) <= budget:
        b += 1
    return b


def test_a_card_gets_the_last_stair_that_fits_with_one_full_size_step():
    # The reserve is a staircase; the search replays the allocator on the
    # step interpolated between two measured ones. See Note [A card's
    # reserve between two steps]. Without the hidden layers' biases: their
    # gradients' sums take a card's staging buffer from batch 1024 on, a
    # step the line between two probes below that does not see
    # (test_card_kernels.py).
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(300, 700, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(700, 700, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(700, 10))
    x, y = data()
    card = fit(model, x, y, BUDGET, "cuda")
    assert card.trials == 1
    assert card.max_batch == true_card_max(model, x, y, BUDGET, card.max_batch)


def test_a_cards_prediction_is_the_reserve_a_profile_at_that_batch_replays():
    model = mlp()
    x, y = data()
    r = memfit.profile(model, x[:8], y[:8], loss_fn=F.cross_entropy, optimizer="adam",
                       target_device="cuda")
    sure = r.prediction(300)
    assert sure.beyond_probes
    assert sure.predicted_reserved_bytes == card_reserved(model, x, y, 300)
    assert "a card would reserve" in sure.text()
    on_cpu = memfit.profile(model, x[:8], y[:8], loss_fn=F.cross_entropy, optimizer="adam",
                            target_device="cpu")
    assert on_cpu.prediction(300).predicted_reserved_bytes == -1
