"""memfit.offload against plain training: the same optimizer without offload,
in float64, over the same batches. On the CPU the host step is the same
arithmetic on the same values, so the weights must be equal bit for bit."""

import copy
import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

pytestmark = pytest.mark.torch_api  # see python/tests/conftest.py


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4)).double()


def _batches(n=5):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 8, generator=g, dtype=torch.float64),
             torch.randn(4, 4, generator=g, dtype=torch.float64)) for _ in range(n)]


def _train_unfreezing_the_head(offloaded):
    model = _net()
    opt = torch.optim.Adam(model[0].parameters(), lr=1e-2)
    if offloaded:
        opt = memfit.offload(opt)
    for i, (x, y) in enumerate(_batches()):
        if i == 2:  # the head joins training: a new param group
            opt.add_param_group({"params": list(model[2].parameters()), "lr": 3e-2})
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_a_param_group_added_later_is_trained_as_plain_adam_trains_it():
    plain, plain_opt = _train_unfreezing_the_head(False)
    off, off_opt = _train_unfreezing_the_head(True)
    head = list(_net()[2].parameters())
    assert any(not torch.equal(p, q) for p, q in zip(off[2].parameters(), head))
    for p, q in zip(off.parameters(), plain.parameters()):
        assert torch.equal(p, q)
    assert off_opt.state_dict()["param_groups"][1]["lr"] == 3e-2
    assert len(off_opt.state_dict()["state"]) == len(plain_opt.state_dict()["state"]) == 4


def test_a_param_group_added_later_keeps_its_state_off_the_simulated_device():
    gc.collect()
    start = tracked_live_bytes("cpu")
    with memfit.simulated_device(1 << 30):
        model = _net()
        opt = memfit.offload(torch.optim.Adam(model[0].parameters(), lr=1e-2))
        opt.add_param_group({"params": list(model[2].parameters())})
        x, y = _batches(1)[0]
        torch.nn.functional.mse_loss(model(x), y).backward()
        before = tracked_live_bytes("cpu")
        opt.step()
        assert tracked_live_bytes("cpu") == before
        assert start < before


def _train_resuming_mid_schedule(offloaded, resume_at=3):
    def build(state=None):
        model = _net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if offloaded:
            opt = memfit.offload(opt)
        if state is not None:
            model.load_state_dict(state[0])
            opt.load_state_dict(state[1])
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 4)
        if state is not None:
            sched.load_state_dict(state[2])
        return model, opt, sched

    model, opt, sched = build()
    for i, (x, y) in enumerate(_batches(6)):
        if i == resume_at:  # a checkpoint saved after the scheduler's step, loaded afresh
            saved = copy.deepcopy((model.state_dict(), opt.state_dict(), sched.state_dict()))
            model, opt, sched = build(saved)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    return model, saved[1]


def test_a_checkpoint_saved_mid_schedule_resumes_as_plain_sgd_resumes():
    plain, plain_saved = _train_resuming_mid_schedule(False)
    off, off_saved = _train_resuming_mid_schedule(True)
    assert off_saved["param_groups"][0]["lr"] == plain_saved["param_groups"][0]["lr"] < 0.1
    for p, q in zip(off.parameters(), plain.parameters()):
        assert torch.equal(p, q)
