"""A loop that copies its model (an EMA by torch's AveragedModel, which
deep-copies it, copy.deepcopy, torch.save of the whole model) runs under
the doctor as it runs without it, and a copy is no model of the loop's.
The best weights kept on the device are named at the copy's line with the
host copy as the fix, claiming what plain steps save with it."""

import copy
import io

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import memfit
from memfit.testing.truth import plain_steps_run, smallest_budget


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


def train_keeping_the_best(model, opt, on_host):
    """The best weights so far, copied on the device (copy.deepcopy) or to
    the host outside the tracked allocator (numpy's, as a GPU run's .cpu())."""
    best_loss = float("inf")
    for x, y in batches(6):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if loss.item() < best_loss:
            best_loss = loss.item()
            best = ({k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
                    if on_host else copy.deepcopy(model))  # <- best
    return best


def test_the_best_weights_kept_on_the_device_claim_what_the_host_saves():
    def build():
        model = mlp()
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    def runs(budget, on_host):
        return plain_steps_run(budget, build,
                               lambda m, o: train_keeping_the_best(m, o, on_host), steps=1)

    on_host = smallest_budget(lambda budget: runs(budget, True), 16 << 10, 64 << 10, 256)
    model, opt = build()
    with memfit.doctor(model, opt) as d:
        train_keeping_the_best(model, opt, False)
    (f,) = [f for f in d.findings if f.kind == "tensors_kept"]
    with open(__file__) as src:
        line = next(i + 1 for i, t in enumerate(src) if t.rstrip().endswith("# <- best"))
    assert f.where.line == line, d.report()
    # It said "del out, loss" and 4.14 KiB: the old copy is alive while the
    # new one is made, and the step began with it.
    assert "state_dict" in f.fix and "del out" not in f.fix, d.report()
    # Plain steps on the device need within 10% of the claim more than on the host.
    claim = f.estimated_saving
    assert runs(on_host + int(1.1 * claim), False) and not runs(on_host + int(0.9 * claim), False)


def test_a_model_saved_inside_the_doctor_names_nothing_of_memfit():
    # torch.save(model) inside the block: the file loads where memfit is not
    # installed, and the copy's hooks do nothing (its forward is the model's).
    model = mlp()
    x = batches(1)[0][0]
    saved = io.BytesIO()
    with memfit.doctor(model, torch.optim.SGD(model.parameters(), lr=0.1)):
        model(x)
        torch.save(model, saved)
    assert b"memfit" not in saved.getvalue()
    saved.seek(0)
    loaded = torch.load(saved, weights_only=False)
    assert torch.equal(loaded(x), model(x))
