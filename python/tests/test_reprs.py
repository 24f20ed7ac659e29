"""Results print as what they are, not as object addresses."""

import torch

import memfit


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def test_every_result_type_has_a_readable_repr():
    x, y = torch.randn(8, 8), torch.randint(0, 2, (8,))
    fit = memfit.find_batch_size(mlp(), x, y, optimizer="sgd", budget="4MiB")
    text = repr(fit)
    assert text.startswith("BatchFit(max_batch=") and f"max_batch={fit.max_batch}," in text
    assert "object at 0x" not in text
    r = memfit.profile(mlp(), x, y, optimizer="sgd")
    t = r.timeline
    for obj, start in [(t.peak(), "Peak(bytes="), (t, "Timeline("),
                       (t.phase_summaries()[0], "PhaseSummary("),
                       (r.peak_model(), "PeakModel(mode=")]:
        assert repr(obj).startswith(start), repr(obj)
    m = mlp()
    step = memfit.Trainer(m, torch.optim.SGD(m.parameters(), lr=0.1),
                          torch.nn.CrossEntropyLoss()).step(x, y)
    assert repr(step).startswith("StepReport(batch=8, micro_batch=8"), repr(step)
    assert "object at 0x" not in repr(r)
