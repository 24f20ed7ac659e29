"""memfit.Trainer with a loss that has weights of its own (an ArcFace-style
margin head) trained by the model's optimizer: each step trains them as the
user's plain step does (loss, backward, optimizer.step(), zero_grad()),
their .grad freed at the end of the step, not carried into the next one."""

import copy

import pytest
import torch
import torch.nn.functional as F

import memfit

CLASSES = 512


class Margin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(CLASSES, 16) * 0.1)

    def forward(self, emb, y):
        return F.cross_entropy(F.normalize(emb) @ F.normalize(self.w).t() * 30, y)


def _made():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 16)).double()
    loss = Margin().double()
    return model, loss


@pytest.mark.parametrize("micro_batch", [0, 8])
def test_the_trainer_trains_a_loss_head_as_the_plain_loop_does(micro_batch):
    # Before, the head's .grad was never freed: from the second step on its
    # Adam update used the sum of every step's gradients (the head off by
    # 7e-4 after two steps, the model after three).
    model, loss = _made()
    twin, twin_loss = copy.deepcopy(model), copy.deepcopy(loss)
    opt = torch.optim.Adam([*model.parameters(), *loss.parameters()], lr=1e-2)
    twin_opt = torch.optim.Adam([*twin.parameters(), *twin_loss.parameters()], lr=1e-2)
    trainer = memfit.Trainer(model, opt, loss, micro_batch=micro_batch, plan=False)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(32, 32, generator=g, dtype=torch.float64)
        y = torch.randint(0, CLASSES, (32,), generator=g)
        trainer.step(x, y)
        twin_loss(twin(x), y).backward()
        twin_opt.step()
        twin_opt.zero_grad()
        assert loss.w.grad is None
    # float64: the split step sums four micro-batches' gradients where the
    # plain step sums the batch's at once; the order of the additions
    # differs by a few ulps of 1e-16, far below one Adam step of 1e-2.
    tol = 0 if micro_batch == 0 else 1e-12
    for a, b in zip([*model.parameters(), loss.w], [*twin.parameters(), twin_loss.w]):
        assert torch.allclose(a, b, rtol=0, atol=tol), (a - b).abs().max()
