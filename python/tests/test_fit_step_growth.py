"""A step that keeps memory past its end (features appended to a list as
tensors) grows step after step: the answer, measured on the steps memfit
records, is unverified and says so with the bytes a step, and the truth, plain steps of the
loop under memfit.simulated_device, runs out of memory later in a longer
loop. A steady loop says nothing (See Note [A step whose memory grows step
after step], report/step_growth.py)."""

import gc

import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import plain_steps_run

BUDGET = 8 << 20


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))


def batch(b):
    g = torch.Generator().manual_seed(1)
    return torch.randn(b, 64, generator=g), torch.randint(0, 10, (b,), generator=g)


def keeping(kept):
    """A step that logs each batch's hidden features, as tensors."""
    def step(model, b):
        x, y = b
        h = model[0](x)
        kept.append(h.detach())
        return F.cross_entropy(model[2](torch.relu(h)), y)
    return step


def test_a_step_that_keeps_its_features_says_its_memory_grows():
    kept = []
    torch.manual_seed(0)
    model = mlp()
    fit = memfit.find_batch_size(model, batch(8), optimizer=torch.optim.Adam(model.parameters()),
                                 budget=BUDGET, step=keeping(kept))
    grows = [n for n in fit.notes if n.startswith("unverified: memory grows step after step")]
    assert len(grows) == 1 and not fit.verified, fit.notes
    # One (8, 512) float32 feature a step at the example's 8 samples.
    assert f"{memfit.format_bytes(8 * 512 * 4)} more was alive" in grows[0]
    del model, kept[:]
    gc.collect()

    def loop(model, opt, b):
        loss = keeping(kept)(model, batch(b))
        loss.backward()
        opt.step()
        opt.zero_grad()

    def build():
        model = mlp()
        return model, torch.optim.Adam(model.parameters()), fit.max_batch

    # Why it must say so: the answer runs the two steps recorded, not six.
    assert plain_steps_run(BUDGET, build, loop, steps=2)
    kept.clear()
    assert not plain_steps_run(BUDGET, build, loop, steps=6)
    kept.clear()


def test_a_steady_loop_says_nothing_of_growth():
    torch.manual_seed(0)
    model = mlp()
    for kw in ({}, {"accumulation_steps": 2}, {"zero_grad": "before_backward"}):
        fit = memfit.find_batch_size(model, *batch(8), loss_fn=F.cross_entropy,
                                     optimizer=torch.optim.Adam(model.parameters()),
                                     budget=BUDGET, verify=False, **kw)
        assert not any("memory grows" in n for n in fit.notes), (kw, fit.notes)
