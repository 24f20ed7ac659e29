"""A target batched along another dimension than the inputs: seq-first
inputs (T, batch, F), torch's RNN default, beside a (batch,) label.
target_batch_dim=0 says so to profile, find_batch_size and the Trainer,
whose probes then cut and repeat the label along its own dimension;
without it the error names it. The label inside the batch with a step=
fits the same, as plain steps run."""

import copy

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import plain_steps_run

T, FEATURES, CLASSES, BUDGET = 12, 16, 5, 4 << 20


class SeqFirst(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.rnn = torch.nn.LSTM(FEATURES, 64)
        self.head = torch.nn.Linear(64, CLASSES)

    def forward(self, x):
        return self.head(self.rnn(x)[0][-1])


def batch(n, dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return (torch.randn(T, n, FEATURES, generator=g, dtype=dtype),
            torch.randint(0, CLASSES, (n,), generator=g))


def test_find_batch_size_cuts_the_label_along_its_own_dimension_as_a_step_would():
    x, y = batch(8)
    fit = memfit.find_batch_size(SeqFirst(), x, y, optimizer="adam", budget=BUDGET,
                                 batch_dim=1, target_batch_dim=0, keep_output=False)
    # The same step written with the label inside the batch and a step=
    # (whose output dies with its locals: keep_output=False above).
    inside = memfit.find_batch_size(SeqFirst(), (x, y), None, optimizer="adam", budget=BUDGET,
                                    batch_dim=(1, 0),
                                    step=lambda model, b: F.cross_entropy(model(b[0]), b[1]))
    assert fit.verified and fit.max_batch == inside.max_batch > 8
    assert fit.measured_peak_bytes == inside.measured_peak_bytes

    def build():
        model = SeqFirst()
        xb, yb = batch(fit.max_batch)
        return model, torch.optim.Adam(model.parameters()), xb, yb

    def step(model, opt, xb, yb):
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert plain_steps_run(BUDGET, build, step)


def test_without_it_the_error_says_to_pass_target_batch_dim():
    x, y = batch(8)
    with pytest.raises(ValueError, match=r"^\[find_batch_size\] the target is cut along dimension 1 .*"
                       r"pass target_batch_dim=0"):
        memfit.find_batch_size(SeqFirst(), x, y, optimizer="adam", budget=BUDGET, batch_dim=1)


@pytest.mark.parametrize("bad", [-1, "0", True, 1.0])
def test_a_target_batch_dim_that_is_not_a_dimension_is_refused_in_one_line(bad):
    x, y = batch(8)
    with pytest.raises(ValueError, match=r"^\[profile\] target_batch_dim must be an int >= 0"):
        memfit.profile(SeqFirst(), x, y, optimizer="adam", batch_dim=1, target_batch_dim=bad)


def test_the_trainer_plans_a_seq_first_batch_and_steps_as_the_whole_batch_would():
    model = SeqFirst().double()
    plain = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch(256, torch.float64)
    trainer = memfit.Trainer(model, opt, loss_fn=F.cross_entropy, budget=BUDGET,
                             batch_dim=1, target_batch_dim=0)
    report = trainer.step(x, y)
    # Planned from the fit (before: not planned, OOMs halved the batch).
    assert trainer.planned is not None and not trainer.planned.failed
    assert 0 < trainer.planned.micro_batch < 256 and report.ooms_recovered == 0

    F.cross_entropy(plain(x), y).backward()
    torch.optim.SGD(plain.parameters(), lr=0.1).step()
    for a, b in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)  # float64: the same step


def test_the_target_inside_the_batch_with_a_step_fits_as_plain_steps_run():
    model = SeqFirst()
    x, y = batch(8)
    fit = memfit.find_batch_size(model, (x, y), None, optimizer=torch.optim.SGD(
        model.parameters(), lr=0.1), budget=BUDGET, batch_dim=(1, 0),
        step=lambda m, b: F.cross_entropy(m(b[0]), b[1]))

    def runs(b):
        def build():
            m = SeqFirst()
            return m, torch.optim.SGD(m.parameters(), lr=0.1), b

        def step(m, opt, n):
            F.cross_entropy(m(torch.randn(T, n, FEATURES)),
                            torch.randint(0, CLASSES, (n,))).backward()
            opt.step()
            opt.zero_grad()

        return plain_steps_run(BUDGET, build, step, steps=3)

    assert runs(fit.max_batch)
    assert not runs(int(fit.max_batch * 1.05) + 1)


def test_a_profile_over_batch_and_length_resizes_the_label_along_its_own_dimension():
    x, y = batch(8)
    report = memfit.profile(SeqFirst(), x, y, optimizer="adam", batch_dim=1,
                            target_batch_dim=0, seq_dim=0)
    predicted = report.prediction(16, length=24)
    xb, yb = batch(16)
    step = memfit.profile(SeqFirst(), torch.cat([xb, xb]), yb, optimizer="adam",
                          batch_dim=1, target_batch_dim=0)
    # The surface's own held-out error bounds its miss at a shape it did not record.
    miss = abs(predicted.predicted_bytes - step.peak_bytes) / step.peak_bytes
    assert miss <= predicted.held_out_error + 1e-9
