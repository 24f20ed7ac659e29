"""A step whose batch 1 runs other CPU kernels (a CNN with BatchNorm: batch
1 is 26% above the line of batches 2 to 64) is predicted past that batch:
probes 1, 2, 4 stopped there and predicted 11% under plain steps at 16 and
17, and 7.5% under batch 1's own step, flagged only in text(). See Note
[Probes past a step's odd small batches] (report/probing.py)."""

import torch
import torch.nn as nn

import memfit
from memfit.testing.truth import loop_body, plain_steps_run


def cnn():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def batch(n):
    g = torch.Generator().manual_seed(n)
    return torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g)


def runs(budget, n):
    def build():
        model = cnn()
        return (model, torch.optim.Adam(model.parameters()), *batch(n))

    def step(model, opt, x, y):
        loop_body(model, opt, x, y, nn.functional.cross_entropy, kept={})

    return plain_steps_run(budget, build, step, steps=3)


def test_predictions_past_an_odd_batch_one_hold_against_plain_steps():
    torch.manual_seed(0)
    model = cnn()
    report = memfit.profile(model, *batch(4), optimizer=torch.optim.Adam(model.parameters()))
    for n in (16, 17, 1):
        sure = report.prediction(n)
        assert sure.affine, sure.text()
        assert runs(int(sure.predicted_bytes * 1.005), n), (n, sure.text())
        assert not runs(int(sure.predicted_bytes * 0.98), n), (n, sure.text())
    # At a batch below the line's probes, the step's own peak.
    assert report.predict_peak_bytes(1) == report.at_batch(1).peak_bytes
    assert not any("not affine" in note for note in report.notes)


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm, self.head = nn.LSTM(32, 64, num_layers=2, batch_first=True), nn.Linear(64, 4)

    def forward(self, x):
        return self.head(self.lstm(x)[0][:, -1])


def sequences(n):
    g = torch.Generator().manual_seed(n)
    return torch.randn(n, 20, 32, generator=g), torch.randint(0, 4, (n,), generator=g)


def test_a_line_of_powers_of_two_is_checked_at_an_odd_batch():
    # The LSTM's CPU step jitters with the batch: probes 2, 4, 8 agree on a
    # line 2% under plain steps at 13.
    def runs_lstm(budget, n):
        def build():
            model = Recurrent()
            return (model, torch.optim.Adam(model.parameters()), *sequences(n))

        def step(model, opt, x, y):
            loop_body(model, opt, x, y, nn.functional.cross_entropy, kept={})

        return plain_steps_run(budget, build, step, steps=3)

    torch.manual_seed(0)
    model = Recurrent()
    report = memfit.profile(model, *sequences(4), optimizer=torch.optim.Adam(model.parameters()))
    sure = report.prediction(13)
    assert runs_lstm(int(sure.predicted_bytes * 1.001), 13), sure.text()
    assert not runs_lstm(int(sure.predicted_bytes * 0.98), 13), sure.text()


def test_a_line_that_still_misses_its_odd_batch_says_so_in_the_prediction():
    # Under 3 MiB the probes cannot grow past 8: the line of 2, 4, 8 misses
    # batch 7 by about 1%, which its held-out check cannot see; a prediction
    # from it says so in its own text(), not only in the report's notes.
    torch.manual_seed(0)
    model = Recurrent()
    with memfit.simulated_device("3MiB"):
        report = memfit.profile(model, *sequences(4),
                                optimizer=torch.optim.Adam(model.parameters()))
        sure = report.prediction(64)
    assert list(sure.probes) == [2, 4, 8], sure.text()
    assert len(sure.notes) == 1 and "missed batch 7's step" in sure.notes[0], sure.notes
    assert sure.notes[0] in sure.text() and sure.notes[0] in report.notes
    # A line that holds has nothing to add.
    assert not memfit.profile(model, *sequences(4)).prediction(16).notes
