"""memfit.advise(target_device="cuda"): a budget for a card is held
against the CUDA caching allocator's reserved bytes, replayed on each
recorded step, not against the allocated bytes (an 8B plan was 22.30 GiB
allocated but 24.15 GiB reserved, against 24 GiB)."""

import pytest
import torch
import torch.nn.functional as F

import memfit


def mlp():
    torch.manual_seed(0)
    # 700x700 weights (1.9 MiB) go to 20 MiB segments on a card: reserved
    # is about twice the allocated peak.
    return torch.nn.Sequential(torch.nn.Linear(300, 700), torch.nn.ReLU(),
                               torch.nn.Linear(700, 700), torch.nn.ReLU(),
                               torch.nn.Linear(700, 10))


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(48, 300, generator=g), torch.randint(0, 10, (48,), generator=g)


def advise(model, budget, target_device):
    x, y = data()
    try:
        return memfit.advise(model, x, y, loss_fn=F.cross_entropy, optimizer="adam",
                             budget=budget, repeats=0, target_device=target_device)
    except memfit.DoesNotFit as e:
        return e.advice


def test_the_budget_is_held_against_reserved_bytes_for_a_card():
    model = mlp()
    x, y = data()
    card = memfit.profile(model, x, y, loss_fn=F.cross_entropy, optimizer="adam",
                          target_device="cuda")
    allocated, reserved = card.peak_bytes, card.cuda.peak_reserved
    assert reserved > allocated * 3 // 2  # the model was chosen for this gap
    # The CPU's own step (its optimizer loops over tensors; a card's runs
    # foreach): also under the budget.
    cpu = memfit.profile(model, x, y, loss_fn=F.cross_entropy, optimizer="adam").peak_bytes
    budget = (max(allocated, cpu) + reserved) // 2

    on_cpu = advise(model, budget, "cpu")
    assert not on_cpu.cuda_reserved
    assert on_cpu.plain_peak_bytes == cpu
    assert on_cpu.rows[0].fits and on_cpu.plan.found and on_cpu.plan.micro_batch == 0

    for_card = advise(model, budget, "cuda")
    assert for_card.cuda_reserved
    assert for_card.plain_peak_bytes == reserved
    assert not for_card.rows[0].fits  # the whole step fits only in allocated bytes
    for r in for_card.rows:
        assert r.fits == (r.peak_bytes <= budget)
    if for_card.plan.found:  # whatever it is, its reserved bytes fit
        assert for_card.plan.peak_bytes <= budget
        assert (for_card.plan.micro_batch, for_card.plan.summary) != (0, "the plain step")
    assert any("expandable_segments:True" in n for n in for_card.notes)
    assert not any("expandable_segments" in n for n in on_cpu.notes)
    assert "peaks: the CUDA caching allocator's reserved bytes" in for_card.table()
    assert '"peaks": "cuda_reserved"' in for_card.to_json()


def test_a_cpu_model_is_planned_for_the_cpu_unless_asked():
    advice = advise(mlp(), None, None)
    assert not advice.cuda_reserved
    assert '"peaks": "allocated"' in advice.to_json()


def test_an_unknown_target_device_is_one_line():
    x, y = data()
    with pytest.raises(ValueError, match=r"target_device must be 'cpu' or 'cuda'.*got 'tpu'"):
        memfit.advise(mlp(), x, y, loss_fn=F.cross_entropy, budget="1GiB", target_device="tpu")
