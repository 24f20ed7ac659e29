"""memfit.Trainer recovers from running out of memory inside the backward's
Python code (torch.utils.checkpoint's recompute) as it does inside a kernel:
the step is run again from its start in smaller micro-batches, and the
gradients handed to the optimizer are the whole batch's (float64), each
sample counted once (Note [Out of memory inside the backward's Python
code], trainer.py)."""

import copy

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import memfit


class Checkpointed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 1024)
        self.b = torch.nn.Linear(1024, 10)

    def forward(self, x):
        return self.b(checkpoint(lambda t: torch.tanh(self.a(t)), x, use_reentrant=False))


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, label_smoothing=0.1)


# Not marked numerics: float64 to 1e-12 holds on any ISA, and run before
# test_trainer_loop's tip-article loop in one process at 2 threads (make
# test-numerics) that loop's first micro-batch of 128 fitted its budget.
def test_out_of_memory_in_a_checkpoints_recompute_is_recovered_to_the_whole_batchs_gradients():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 64, dtype=torch.float64, generator=g)
    y = torch.randint(0, 10, (256,), generator=g)
    model = Checkpointed().double()
    eager = copy.deepcopy(model)
    step(eager, (x, y)).backward()
    seen = []

    class Capture(torch.optim.SGD):
        def step(self, closure=None):
            seen.append([p.grad.clone() for p in model.parameters()])

    # Whole, the recompute's (256, 1024) activations in the backward run out
    # of 3 MiB: it raised RuntimeError (an OOM from Python code inside C++).
    trainer = memfit.Trainer(model, Capture(model.parameters(), lr=0.0), step=step,
                             budget="3MiB", micro_batch=256)
    r = trainer.step((x, y))
    assert r.samples == 256 and r.micro_batch < 256 and sum(r.chunks) == 256
    assert any("ran again from its start" in n for n in r.notes), r.notes
    assert len(seen) == 1
    # float64 throughout: micro-batches summed against one batch differ by
    # summation order only, ~1e-16 relative.
    for got, want in zip(seen[0], (p.grad for p in eager.parameters())):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
