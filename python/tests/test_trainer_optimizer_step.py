"""The Trainer calls optimizer.step as it is at each step: a wrapper set on
it after the Trainer was made (an LR scheduler's call counter, a user's
gradient clipping) runs as it does in the user's own loop."""

import warnings

import torch
import torch.nn.functional as F

import memfit


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(24, 8, generator=g), torch.randint(0, 4, (24,), generator=g)


def clipping(m, opt):
    """opt.step, wrapped to clip the gradients first, as a user's loop does."""
    plain_step = opt.step

    def step(*args, **kwargs):
        torch.nn.utils.clip_grad_norm_(m.parameters(), 0.01)
        return plain_step(*args, **kwargs)

    opt.step = step


def test_a_clipping_wrapper_set_after_the_trainer_clips_as_the_plain_loop_does():
    x, y = batch()
    plain = model()
    opt = torch.optim.SGD(plain.parameters(), lr=0.5)
    clipping(plain, opt)
    F.cross_entropy(plain(x), y).backward()
    opt.step()

    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    trainer = memfit.Trainer(m, opt, F.cross_entropy, micro_batch=5)
    clipping(m, opt)
    trainer.step(x, y)
    for p, q in zip(m.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q)


def test_a_scheduler_made_after_the_trainer_sees_the_optimizer_step():
    x, y = batch()
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    trainer = memfit.Trainer(m, opt, F.cross_entropy, micro_batch=5)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "lr_scheduler.step() before optimizer.step()"
        for _ in range(2):
            trainer.step(x, y)
            scheduler.step()
    assert opt.param_groups[0]["lr"] == 0.125
