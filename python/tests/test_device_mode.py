"""mode="device": the step measured on the device the model is on, held to
that device's own limit (the simulated device here; a card by its caching
allocator's counters), and the report saying which truth it holds."""

import gc

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memfit
from memfit.report.places import PhaseSample, phase_timeline
from memfit.testing.truth import largest_that_fits, plain_steps_run
from memfit._native import native as _memfit

BUDGET = 8 << 20


def _mlp():
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))


def _batch(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 256, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_on_the_simulated_device_the_default_is_the_device_and_says_so():
    x, y = _batch(8)
    with memfit.simulated_device(BUDGET):
        model = _mlp()
        opt = torch.optim.Adam(model.parameters())
        on_device = memfit.profile(model, x, y, optimizer=opt)
        rehearsed = memfit.profile(model, x, y, optimizer=opt, mode="cpu")
    assert on_device.mode == "device" and rehearsed.mode == "cpu"
    assert on_device.truth == "measured on the simulated device (8.00 MiB budget)"
    assert rehearsed.truth == "rehearsed on the CPU"
    # The simulated device's allocator is memfit's tracker: the same bytes.
    assert on_device.peak_bytes == rehearsed.peak_bytes
    assert on_device.table().splitlines()[1] == on_device.truth
    assert '"truth": "measured on the simulated device' in on_device.to_json()


def test_device_mode_without_a_device_to_measure_names_the_ways_out():
    x, y = _batch(4)
    with pytest.raises(ValueError) as e:
        memfit.profile(_mlp(), x, y, mode="device")
    msg = str(e.value)
    assert msg.startswith("[profile] mode='device'") and "\n" not in msg
    assert "memfit.simulated_device" in msg and "mode='cpu'" in msg
    assert memfit.profile(_mlp(), x, y).mode == "cpu"  # the default where no device is seen
    with pytest.raises(ValueError, match=r"\[find_batch_size\] mode must be"):
        memfit.find_batch_size(_mlp(), x, y, budget="64MiB", mode="gpu")


def _plain_step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    opt.step()


@pytest.mark.slow  # 18-37 s on 2 busy cores
def test_an_example_the_device_cannot_run_is_cut_and_the_answer_runs_plain_steps(request):
    # The example (3200 samples) runs out of memory on the device: the fit
    # goes on from a cut that runs, and its answer runs plain steps (no
    # memfit recorder) on the same device, while one more sample than the
    # plain-step truth does not. The user's model, optimizer and RNG are as
    # before.
    # The truth's search collects garbage some 18 times, each a walk of
    # every object alive (most of this test's time after earlier tests):
    # what was alive before the test is collected once and frozen, left out
    # of those walks; none of it becomes garbage here (what the test makes
    # is not frozen), so each collection frees the same bytes.
    gc.collect()
    gc.freeze()
    request.addfinalizer(gc.unfreeze)
    x, y = _batch(3200)
    with memfit.simulated_device(BUDGET):
        torch.manual_seed(1)
        model = _mlp()
        opt = torch.optim.Adam(model.parameters())
        with memfit.host_memory():  # the test's copy is not the device's
            weights = [p.detach().clone() for p in model.parameters()]
        rng = torch.get_rng_state()
        fit = memfit.find_batch_size(model, x, y, optimizer=opt)
        assert [torch.equal(a, b) for a, b in zip(weights, model.parameters())] == [True] * 4
        assert not opt.state and torch.equal(rng, torch.get_rng_state())
    assert fit.mode == "device" and fit.verified
    del model, opt, weights  # the truth runs on a device of its own

    def build():
        torch.manual_seed(1)
        m = _mlp()
        return m, torch.optim.Adam(m.parameters())

    def fits(n):
        xs, ys = _batch(n)  # on the host; each step moves it to the device, as x.to("cuda")
        return plain_steps_run(BUDGET, build,
                               lambda m, o: _plain_step(m, o, xs.clone(), ys.clone()))

    true_max = largest_that_fits(fits, fit.max_batch)
    assert fit.max_batch <= true_max
    # Close to it: 370 of 380 measured (the search stops with 133 KB of the
    # budget unused, about 13 samples); before the batch was counted on the
    # device, the truth was 412 and the bar 0.9.
    assert fit.max_batch >= 0.97 * true_max, (fit.max_batch, true_max)


def test_a_cards_phase_counters_make_a_report_with_their_peaks():
    # What CardCounters reads on a card, per phase (bytes beside the step
    # taken out): the report's peak is the largest phase peak, each phase
    # keeps its own, and the budget is held against the reserved bytes.
    samples = [PhaseSample("parameters", 1, 0, 4000, 4000),
               PhaseSample("inputs", 1, 4000, 4100, 4100),
               PhaseSample("forward", 1, 4100, 9000, 7000),
               PhaseSample("loss", 1, 7000, 7100, 7050),
               PhaseSample("backward", 1, 7050, 12000, 5000),
               PhaseSample("optimizer_step", 1, 5000, 13000, 11000),
               PhaseSample("zero_grad", 1, 11000, 11000, 8000)]
    timeline = phase_timeline(samples)
    native = _memfit.make_report(timeline, "Mlp", 4, "adam", "device")
    assert native.peak_bytes == 13000 and native.peak_phase == "optimizer_step"
    assert [(p.name, p.peak_bytes) for p in native.phases] == [
        (s.name, s.peak) for s in samples]
    native.set_card_figures(13000, 2 << 20)
    assert native.budget_peak() == 2 << 20


def test_the_trainer_plans_its_micro_batch_on_the_device_and_runs_it_without_an_oom():
    # A batch the simulated device cannot run whole: the Trainer's plan is
    # measured there (mode "device"), and its steps split the batch as
    # planned, with no out-of-memory error to recover.
    x, y = _batch(1024)
    with memfit.simulated_device(BUDGET):
        torch.manual_seed(0)
        model = _mlp()
        trainer = memfit.Trainer(model, torch.optim.Adam(model.parameters()), F.cross_entropy)
        reports = [trainer.step(x, y) for _ in range(2)]
    plan = trainer.planned
    assert plan.whole.mode == "device" and plan.split.mode == "device"
    assert plan.micro_batch and plan.micro_batch < 1024
    assert [r.ooms_recovered for r in reports] == [0, 0]
    assert all(r.micro_batch == plan.micro_batch for r in reports)
