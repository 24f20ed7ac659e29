"""A model whose forward keeps a key/value cache across calls in a tuple
attribute (self.cache = (k, v)): find_batch_size left the last probe's cache
on the user's model, each probe read the one before's (0.886 of what plain
steps run), and on meta the next rehearsal mixed that CPU cache into meta
tensors and raised. See Note [A cache a forward keeps in a container]
(user_state.py). The truth: plain steps of the user's loop."""

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import plain_steps_run

BUDGET = 8 << 20


class CachedAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(64, 64) for _ in range(3))
        self.out = torch.nn.Linear(64, 10)
        self.cache = None

    def forward(self, x):  # (batch, tokens, 64)
        k, v = self.k(x), self.v(x)
        if self.cache is not None and self.cache[0].shape[0] == x.shape[0]:
            k, v = torch.cat([self.cache[0], k], 1), torch.cat([self.cache[1], v], 1)
        self.cache = (k[:, -16:].detach().clone(), v[:, -16:].detach().clone())
        attention = torch.softmax(self.q(x) @ k.transpose(1, 2) / 8, -1)
        return self.out((attention @ v).mean(1))


def _data(b):
    return torch.randn(b, 32, 64), torch.randint(0, 10, (b,))


def _step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def _build():
    torch.manual_seed(0)
    model = CachedAttention()
    return model, torch.optim.Adam(model.parameters())


def _loop(model, opt, b):
    _step(model, _data(b)).backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("mode", ["cpu", "meta"])
def test_a_cache_in_a_tuple_comes_back_as_it_was_and_the_answer_runs(mode):
    model, opt = _build()
    x, y = _data(4)
    model(x)  # the user's cache, of another batch size
    cache = model.cache
    fit = memfit.find_batch_size(model, _data(8), optimizer=opt, budget=BUDGET, step=_step,
                                 mode=mode)
    assert model.cache is cache
    assert plain_steps_run(BUDGET, lambda: (*_build(), fit.max_batch), _loop, steps=3)
    bigger = int(fit.max_batch * 1.1) + 1
    assert not plain_steps_run(BUDGET, lambda: (*_build(), bigger), _loop, steps=3)
