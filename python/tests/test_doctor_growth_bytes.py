"""memory_growth in a forward-only loop claims the bytes each step keeps, as
the live bytes after plain steps of the same loop grow: the last step,
which ends at the loop's last torch call, still holds that line's
temporaries (the model's output under `.argmax(1)`) and is not a step's
end to measure growth at."""

import gc
import os

import torch
from torch import nn

import memfit
from memfit._native import tracked_live_bytes

THIS = os.path.realpath(__file__)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).eval()


def batches(n=8, batch=256):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(batch, 64, generator=g) for _ in range(n)]


def predict(model, data, after_step=lambda: None):
    preds = []
    with torch.inference_mode():
        for x in data:
            preds.append(model(x).argmax(1))  # <- preds
            after_step()
    return preds


def test_a_list_of_predictions_grows_by_what_each_step_keeps():
    gc.collect()
    live = []
    with memfit.simulated_device(1 << 40):
        model, data = mlp(), batches()
        base = tracked_live_bytes("cpu")
        predict(model, data, lambda: live.append(tracked_live_bytes("cpu") - base))
    truth = {b - a for a, b in zip(live, live[1:])}
    assert truth == {256 * 8}, live  # one int64 per row

    model, data = mlp(), batches()
    with memfit.doctor(model) as d:
        predict(model, data)
    growth = [f for f in d.findings if f.kind == "memory_growth"]
    assert len(growth) == 1, d.report()
    f = growth[0]
    with open(THIS) as src:
        line = next(i + 1 for i, t in enumerate(src) if t.rstrip().endswith("# <- preds"))
    assert os.path.realpath(f.where.file) == THIS and f.where.line == line, d.report()
    # It said 3.67 KiB: the last step's end held the model's 10 KiB output.
    assert f.bytes == 256 * 8 and f.estimated_saving == 256 * 8, d.report()
