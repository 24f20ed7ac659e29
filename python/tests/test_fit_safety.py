"""find_batch_size on models it was not built with: never above what fits,
close to it, and saying when the memory is not affine in the batch."""

import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes


class PathByBatch(torch.nn.Module):
    """Per-sample memory that jumps at a batch, as CPU kernels that change
    algorithm with the batch make it: from `switch` samples on, the hidden
    activation is computed at twice the width (a kernel's workspace that
    autograd saves)."""

    def __init__(self, switch=48):
        super().__init__()
        self.switch = switch
        self.inner = torch.nn.Linear(64, 256)
        self.head = torch.nn.Linear(256, 8)

    def forward(self, x):
        h = torch.relu(self.inner(x))
        if x.shape[0] >= self.switch:
            h = torch.cat([h, h], dim=1)[:, :256] * 1.0
        return self.head(h)


def true_max(model, x, y, budget):
    """The largest batch whose measured step fits `budget`, by bisection on
    real recorded steps."""
    report = memfit.profile(model, x, y, optimizer="adam")

    def peak(b):
        return report.at_batch(b).peak_bytes

    lo, hi = 1, 2
    while peak(hi) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if peak(mid) <= budget else (lo, mid)
    return lo, peak


def test_a_step_whose_memory_jumps_with_the_batch_is_fit_safely_and_called_not_affine():
    torch.manual_seed(0)
    model = PathByBatch()
    x, y = torch.randn(4, 64), torch.randn(4, 8)
    budget = 6 << 20
    fit = memfit.find_batch_size(model, x, y, optimizer="adam", budget=budget)
    truth, peak = true_max(model, x, y, budget)
    assert fit.verified
    assert fit.max_batch <= truth
    assert fit.max_batch >= 0.98 * truth
    assert peak(fit.max_batch) <= budget
    assert fit.measured_peak_bytes == peak(fit.max_batch)
    assert not fit.affine
    assert any("not affine" in n for n in fit.notes), fit.notes


def test_without_verify_the_answer_is_the_models_and_says_unverified():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    x, y = torch.randn(4, 64), torch.randn(4, 8)
    fit = memfit.find_batch_size(model, x, y, optimizer="adam", budget="8MiB", verify=False)
    assert not fit.verified
    assert fit.trials == 0
    assert all(not p.verification for p in fit.probes)
    assert '"verified": false' in fit.to_json()


def test_fit_under_a_simulated_device_never_returns_a_batch_that_ran_out_of_memory():
    torch.manual_seed(0)
    model = PathByBatch(switch=24)
    x, y = torch.randn(4, 64), torch.randn(4, 8)
    with memfit.simulated_device("5MiB"):
        fit = memfit.find_batch_size(model, x, y, optimizer="adam")
    assert fit.verified
    answer = [p for p in fit.probes if p.batch == fit.max_batch and not p.out_of_memory]
    assert answer and answer[0].peak_bytes <= 5 << 20
    assert all(not (p.batch <= fit.max_batch and p.out_of_memory) for p in fit.probes)


def test_a_prediction_says_how_sure_it_is():
    torch.manual_seed(0)
    model = PathByBatch()
    x, y = torch.randn(4, 64), torch.randn(4, 8)
    report = memfit.profile(model, x, y, optimizer="adam")
    c = report.prediction(512)
    assert c.predicted_bytes == report.predict_peak_bytes(512)
    assert c.beyond_probes
    assert max(c.probes) * 8 >= 512
    # Probes grew past the switch, so the line is the one above it.
    assert abs(c.predicted_bytes - report.at_batch(512).peak_bytes) <= 0.01 * c.predicted_bytes
    assert "extrapolated beyond the largest probe" in c.text()


def test_a_budget_below_the_model_names_the_model_not_the_batch():
    model = torch.nn.Sequential(torch.nn.Linear(64, 8))
    x, y = torch.randn(4, 64), torch.randn(4, 8)
    with pytest.raises(memfit.DoesNotFit, match="below what the model needs before any sample"):
        memfit.find_batch_size(model, x, y, optimizer="adam", budget=1024)


def test_a_budget_between_the_model_and_one_sample_says_one_sample_does_not_fit():
    model = torch.nn.Sequential(torch.nn.Linear(64, 8))
    x, y = torch.randn(4, 4096, 64), torch.randn(4, 4096, 8)
    fixed = memfit.profile(model, x, y, optimizer="adam").at_batch(1).peak_bytes // 2
    with pytest.raises(memfit.DoesNotFit, match="even one sample does not fit"):
        memfit.find_batch_size(model, x, y, optimizer="adam", budget=fixed)


def test_a_search_capped_at_a_batch_stops_there():
    # The Trainer's question: does its batch fit? No batch above it is
    # measured, and the answer is the batch itself when it fits.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    x, y = torch.randn(2, 16), torch.randint(0, 4, (2,))
    report = memfit.profile(model, x, y, optimizer="sgd")
    fit = memfit.plan.fit.search(report, 1 << 30, max_batch=40)
    assert fit.max_batch == 40 and fit.verified
    assert max(p.batch for p in fit.probes) == 40
    with pytest.raises(ValueError, match=r"^\[search_batch\] max_batch must be >= 1, got 0"):
        memfit._memfit.search_batch(report.measure_step, 1 << 30, max_batch=0)


def test_a_batchnorm_model_whose_two_samples_do_not_fit_is_does_not_fit_not_its_error():
    # The search goes to batch 1 where 2 does not fit, and BatchNorm in
    # training raises there: before, the user got only torch's "Expected
    # more than 1 value per channel when training", as if the model were
    # wrong (a card's budget below its weights and workspaces).
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.BatchNorm1d(512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10))
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    with pytest.raises(memfit.DoesNotFit, match=r"^\[find_batch_size\] even batch 2 does not "
                                                r"fit: its step took .*, and batch 1 cannot "
                                                r"train \(ValueError: Expected more than 1 value"):
        memfit.find_batch_size(model, x, y, loss_fn=torch.nn.CrossEntropyLoss(),
                               optimizer="adam", budget="1MiB", target_device="cuda", mode="cpu")


def test_a_device_the_model_and_its_adam_state_fill_names_them():
    # On the device (the simulated one here, a card alike) even one sample
    # ran out, and the device's own message said to let memfit find a
    # batch. The weights (9.8 MiB), their gradients and Adam's two states
    # take 39 MiB of a 24 MiB device: that is the cause, and plain steps of
    # one sample run out there too.
    from memfit.testing.truth import plain_steps_run

    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.EmbeddingBag(20000, 128), torch.nn.Linear(128, 10))
        return model, torch.optim.Adam(model.parameters())

    def one_sample(model, opt):
        torch.nn.functional.cross_entropy(model(torch.randint(0, 20000, (1, 8))),
                                          torch.randint(0, 10, (1,))).backward()
        opt.step()
        opt.zero_grad()

    budget = 24 << 20
    assert not plain_steps_run(budget, build, one_sample)
    gc.collect()
    with memfit.simulated_device(budget + tracked_live_bytes("cpu")):
        model, opt = build()
        x, y = torch.randint(0, 20000, (4, 8)), torch.randint(0, 10, (4,))
        with pytest.raises(memfit.DoesNotFit,
                           match=r"^\[find_batch_size\] not even one sample fits: .*Adam's state at "
                                 r"its first step \(19\.5\d MiB\) take 39\.\d\d MiB"):
            memfit.find_batch_size(model, x, y, optimizer=opt)


def test_the_callbacks_name_the_model_and_its_adam_state_too():
    # Lightning's and Hugging Face's callbacks size through plan_batch.
    from memfit.integrations import api

    gc.collect()
    with memfit.simulated_device((24 << 20) + tracked_live_bytes("cpu")):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.EmbeddingBag(20000, 128), torch.nn.Linear(128, 10))
        how = api.UserStep(step=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
                           what="Callback")
        batch = torch.randint(0, 20000, (4, 8)), torch.randint(0, 10, (4,))
        with pytest.raises(memfit.DoesNotFit, match=r"^\[Callback\] not even one sample fits: "
                                                    r".*Adam's state at its first step"):
            api.plan_batch(model, batch, torch.optim.Adam(model.parameters()),
                           whole=api.LoopStep(how), budget=None, what="Callback")
