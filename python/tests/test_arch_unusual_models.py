"""find_batch_size on structures memfit was not built with: top-k routed
experts, spectral-norm parametrizations (buffers updated on each forward), a
queue buffer written in place. Truth: the user's loop as plain steps on
fresh batches under the simulated device; the user's model (weights,
buffers, .grad) is as it was after the fit."""

import gc

import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils.parametrizations import spectral_norm

import memfit
from memfit._native import tracked_live_bytes
from memfit.testing.truth import largest_that_fits, loop_body, plain_steps_run

BUDGET = 6 << 20
T, D, EXPERTS = 8, 32, 4


def _mlp(width=4):
    return torch.nn.Sequential(torch.nn.Linear(D, width * D), torch.nn.GELU(),
                               torch.nn.Linear(width * D, D))


class TopTwoExperts(torch.nn.Module):
    """Each token goes to its two best experts (torch.where on the routing):
    which expert runs how many tokens follows the values."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(D, EXPERTS)
        self.experts = torch.nn.ModuleList(_mlp() for _ in range(EXPERTS))
        self.head = torch.nn.Linear(D, 10)

    def forward(self, x):
        flat = x.reshape(-1, D)
        w, idx = torch.topk(torch.softmax(self.gate(flat), -1), 2, dim=-1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.where(idx == e)
            out = out.index_add(0, tok, expert(flat[tok]) * w[tok, slot, None])
        return self.head(out.reshape(x.shape).mean(1))


class SpectralNormed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = spectral_norm(torch.nn.Linear(D, 4 * D))
        self.b = spectral_norm(torch.nn.Linear(4 * D, D))
        self.head = torch.nn.Linear(D, 10)

    def forward(self, x):
        return self.head(self.b(F.relu(self.a(x))).mean(1))


class QueueBuffer(torch.nn.Module):
    """MoCo's queue: each forward writes its batch's features in place at a
    pointer, and a running mean is updated in place."""

    def __init__(self):
        super().__init__()
        self.body = _mlp()
        self.head = torch.nn.Linear(D, 10)
        self.register_buffer("queue", torch.zeros(256, D))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))
        self.register_buffer("running", torch.zeros(D))

    def forward(self, x):
        h = self.body(x).mean(1)
        with torch.no_grad():
            self.running.mul_(0.9).add_(h.mean(0), alpha=0.1)
            at = (torch.arange(h.shape[0]) + self.ptr) % self.queue.shape[0]
            self.queue[at] = h
            self.ptr.add_(h.shape[0]).remainder_(self.queue.shape[0])
        return self.head(h) + (h @ self.queue.T).mean(1, keepdim=True)


def _batch(n, generator=None):
    return (torch.randn(n, T, D, generator=generator),
            torch.randint(0, 10, (n,), generator=generator))


def _runs(cls, n):
    def build():
        model = cls()
        return model, torch.optim.Adam(model.parameters()), {}

    def step(model, opt, kept):
        loop_body(model, opt, *_batch(n), F.cross_entropy, kept)
    return plain_steps_run(BUDGET, build, step, steps=3)


@pytest.mark.parametrize("cls", [TopTwoExperts, SpectralNormed, QueueBuffer],
                         ids=["moe", "spectral_norm", "queue"])
def test_the_answer_runs_on_fresh_batches_and_leaves_the_model(cls):
    gc.collect()
    torch.manual_seed(0)
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        model = cls()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        fit = memfit.find_batch_size(model, *_batch(8, torch.Generator().manual_seed(1)),
                                     loss_fn=F.cross_entropy,
                                     optimizer=torch.optim.Adam(model.parameters()))
        after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before), \
        [k for k in before if not torch.equal(before[k], after[k])]
    assert all(p.grad is None for p in model.parameters())
    truth = largest_that_fits(lambda n: _runs(cls, n), fit.max_batch)
    assert fit.max_batch <= truth, (fit.max_batch, truth)
    assert fit.max_batch >= 0.9 * truth, (fit.max_batch, truth)
    routed = any("nonzero or boolean indexing" in n for n in fit.notes)
    assert routed == (cls is TopTwoExperts), fit.notes
    assert fit.verified == (cls is not TopTwoExperts)  # routed: measured on 8 samples repeated
