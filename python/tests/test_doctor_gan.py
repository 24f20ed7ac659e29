"""A GAN's loop, two optimizers stepped in turn: the generator's output,
made before the discriminator's step and used after it by the generator's
loss, is of the same iteration, not a graph carried into the next step
(plain iterations keep nothing: their live bytes stay flat); a total of the
generator's loss carried across iterations still is."""

import gc
import os

import torch
import torch.nn.functional as F
from torch import nn

import memfit
from memfit._native import tracked_live_bytes

THIS = os.path.realpath(__file__)
STEPS = 5


def nets():
    torch.manual_seed(0)
    g = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 64))
    d = nn.Sequential(nn.Linear(64, 128), nn.LeakyReLU(0.2), nn.Linear(128, 1))
    return g, d, torch.optim.Adam(g.parameters()), torch.optim.Adam(d.parameters())


def gan_loop(g, d, opt_g, opt_d, carry=False, after=lambda: None):
    ones, zeros = torch.ones(32, 1), torch.zeros(32, 1)
    total = 0
    for _ in range(STEPS):
        real = torch.randn(32, 64)
        fake = g(torch.randn(32, 16))
        opt_d.zero_grad()
        loss_d = (F.binary_cross_entropy_with_logits(d(real), ones)
                  + F.binary_cross_entropy_with_logits(d(fake.detach()), zeros))
        loss_d.backward()
        opt_d.step()
        opt_g.zero_grad()
        loss_g = F.binary_cross_entropy_with_logits(d(fake), ones)
        loss_g.backward()
        opt_g.step()
        total = total + loss_g if carry else total + loss_g.item()  # <- total
        after()
    return total


def test_a_gan_loop_carries_no_graph():
    gc.collect()
    live = []
    with memfit.simulated_device(1 << 40):
        state = nets()
        base = tracked_live_bytes("cpu")
        gan_loop(*state, after=lambda: live.append(tracked_live_bytes("cpu") - base))
    assert len(set(live[1:])) == 1, live  # the truth: nothing is kept from one to the next

    with memfit.doctor() as doc:
        gan_loop(*nets())
    # It said: `D(fake)` takes a tensor that requires grad from an earlier step.
    assert doc.findings == [], doc.report()


def test_a_gan_loss_total_carried_as_a_tensor_is_graph_kept():
    with memfit.doctor() as doc:
        gan_loop(*nets(), carry=True)
    found = [f for f in doc.findings if f.kind == "graph_kept"]
    with open(THIS) as src:
        line = next(i + 1 for i, t in enumerate(src) if t.rstrip().endswith("# <- total"))
    assert [(os.path.realpath(f.where.file), f.where.line) for f in found] == [(THIS, line)], \
        doc.report()
