"""A loop that copies its model (an EMA by torch's AveragedModel, which
deep-copies it, copy.deepcopy, torch.save of the whole model) runs under
the doctor as it runs without it, and a copy is no model of the loop's."""

import copy
import io

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import memfit


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))


def batches(n=5):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 32, generator=g), torch.randint(0, 8, (16,), generator=g))
            for _ in range(n)]


def train_with_copies(model, opt):
    """An EMA model updated after each step, the whole model saved at each
    step and copied at the end: what the EMA and the copy compute."""
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    for x, y in batches():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        ema.update_parameters(model)
        torch.save(model, io.BytesIO())
    last = copy.deepcopy(model)
    with torch.no_grad():
        x = batches(1)[0][0]
        return ema(x), last(x)


def test_a_loop_that_copies_its_model_runs_the_same_under_the_doctor():
    model = mlp()
    expected = train_with_copies(model, torch.optim.SGD(model.parameters(), lr=0.1))
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with memfit.doctor(model, opt) as d:
        got = train_with_copies(model, opt)  # raised: the hooks' observer cannot be copied
    for e, g in zip(expected, got):
        assert torch.equal(e, g)
    # The copies' forwards (the EMA's, the last copy's) are not the model's.
    assert len(d.steps) == 5, d.report()
    assert d.findings == [], d.report()
