"""On a card, memfit's searches run each step with only the budget (the
card's per-process memory fraction) and put the user's fraction back: See
Note [A card capped at the budget] (report/places.py). No card here: the
adapter's calls into torch.cuda are recorded by stand-ins, which is all the
adapter does."""

import types

import pytest
import torch

from memfit._native import native as _memfit
from memfit.report.places import CardCounters, PhaseSample, capped_at_budget

GiB = 1 << 30
CARD = torch.device("cuda", 0)


class _OnTheCard:
    """A model as capped_at_budget sees one on cuda:0: its parameters' device."""

    def parameters(self):
        return iter([types.SimpleNamespace(is_cuda=True, device=CARD)])

    def buffers(self):
        return iter([])


@pytest.fixture
def card(monkeypatch):
    """A 100 GiB cuda:0 whose fraction calls are recorded."""
    state = types.SimpleNamespace(fraction=1.0, calls=[])

    def set_fraction(fraction, device=None):
        state.calls.append((fraction, device))
        state.fraction = fraction

    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction",
                        lambda device=None: state.fraction)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: types.SimpleNamespace(total_memory=100 * GiB))
    return state


def test_the_card_runs_capped_at_the_budget_inside_and_as_before_after(card):
    with capped_at_budget(_OnTheCard(), 25 * GiB):
        assert card.fraction == 0.25
        with capped_at_budget(_OnTheCard(), 50 * GiB):  # a search inside a search: the first
            assert card.fraction == 0.25
    assert card.fraction == 1.0
    assert card.calls == [(0.25, CARD), (1.0, CARD)]


def test_the_users_own_lower_fraction_is_kept_and_put_back_after_an_error(card):
    card.fraction = 0.1  # the user shares the card: 10 GiB
    with pytest.raises(torch.cuda.OutOfMemoryError):
        with capped_at_budget(_OnTheCard(), 25 * GiB):
            assert card.fraction == 0.1
            raise torch.cuda.OutOfMemoryError("a step past the cap")
    assert card.fraction == 0.1


def test_off_a_card_nothing_is_capped(card):
    with capped_at_budget(torch.nn.Linear(2, 2), 25 * GiB):
        pass
    assert card.calls == []


def _counted(device):
    counters = CardCounters(device)
    counters.samples = [PhaseSample("parameters", 1, 0, 4000, 4000),
                        PhaseSample("forward", 1, 4000, 9000, 7000),
                        PhaseSample("backward", 1, 7000, 12000, 5000)]
    counters.peak_allocated, counters.peak_reserved = 12000, 2 << 20
    return counters


def test_a_capped_step_is_held_to_the_budget_by_its_allocated_bytes(card):
    # Uncapped, the reserve is what a budget holds (the cache the allocator
    # kept counts); capped, a step that ran fits, and the search needs the
    # allocated peak, which grows with the batch as the reserve's stairs do not.
    native, _ = _counted(CARD).report("Mlp", 4, "adam")
    assert native.budget_peak() == 2 << 20
    with capped_at_budget(_OnTheCard(), 25 * GiB):
        counters = _counted(CARD)
        native, _ = counters.report("Mlp", 4, "adam")
        note = counters.note()
    assert native.budget_peak() == 12000 and native.cuda is None
    assert "run with only the budget (25.00 GiB" in note
    assert _memfit.format_bytes(2 << 20) + " reserved at most" in note
