"""An LR scheduler stepped inside the user's wrapper on optimizer.step (clip
the gradients, step, then sched.step(), as many loops write it): the
rehearsals run that wrapper, and the scheduler is left where it was (its
count, its last lr) and the optimizer's lr with it. See Note [What the
user's functions keep] (callable_state.py)."""

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

import memfit


def _batch(n):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_a_scheduler_stepped_in_the_optimizers_wrapper_is_left_where_it_was():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=100)
    inner = opt.step

    @functools.wraps(inner)
    def clipped(*args, **kwargs):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        out = inner(*args, **kwargs)
        sched.step()
        return out
    opt.step = clipped
    x, y = _batch(16)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    before = sched.state_dict()
    lrs = [g["lr"] for g in opt.param_groups]
    memfit.find_batch_size(model, *_batch(8), optimizer=opt, budget=4 << 20, mode="meta")
    after = sched.state_dict()
    assert after["last_epoch"] == before["last_epoch"] == 1
    assert after == before
    assert [g["lr"] for g in opt.param_groups] == lrs
    opt.step()  # the user's next step carries on from the count the scheduler had
    assert sched.state_dict()["last_epoch"] == 2
