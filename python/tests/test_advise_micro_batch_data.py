"""A plan in micro-batches is recorded on one micro-batch's data, while the
user's whole batch stays on the device that memfit.Trainer (or a loop
slicing it) splits: advise keeps the batch's data out of the budget, as
`memfit advise` does, so the plan runs within the budget in plain steps,
and the plan's peak counts the rest of the batch beside the micro-batch:
plain steps slicing the batch run in that many bytes (the micro-batch's
step alone claimed 2-5% under them)."""

import pytest
import torch

import memfit
from memfit.testing.truth import plain_steps_run, smallest_budget

pytestmark = pytest.mark.torch_api  # see python/tests/conftest.py

N, WIDTH = 512, 128


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, WIDTH))


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(N, WIDTH, generator=g), torch.randn(N, WIDTH, generator=g)


def test_a_plan_in_micro_batches_runs_with_the_whole_batch_on_the_device():
    x, y = batch()
    loss_fn = torch.nn.functional.mse_loss
    kw = dict(loss_fn=loss_fn, optimizer="sgd", repeats=0, keep_output=False)
    plain = memfit.advise(make_model(), x, y, **kw).plain_peak_bytes
    halves = memfit.advise(make_model(), x, y, budget=plain * 9 // 10, **kw).plan
    assert halves.micro_batch == N // 2
    # Its peak holds the other half beside the step: a budget above the
    # step on half the data alone, below it with the other half beside it.
    budget = halves.peak_bytes - (x.nbytes + y.nbytes) // 4
    advice = memfit.advise(make_model(), x, y, budget=budget, **kw)
    micro = advice.plan.micro_batch
    assert advice.plan.found and 0 < micro < N // 2, advice.table()

    def build():
        model = make_model()
        # The whole batch on the device, sliced into the plan's micro-batches.
        return model, torch.optim.SGD(model.parameters(), lr=1e-3), x.clone(), y.clone()

    def step(model, opt, xs, ys):
        for s in range(0, N, micro):
            (loss_fn(model(xs[s:s + micro]), ys[s:s + micro]) * (micro / N)).backward()
        opt.step()
        opt.zero_grad(set_to_none=not advice.plan.strategy.zero_grad_in_place)

    assert plain_steps_run(budget, build, step, steps=3), advice.table()
    # The claimed peak holds the plain steps (truth: within 4 KiB above
    # the smallest budget they run in).
    claimed = advice.plan.peak_bytes
    truth = smallest_budget(lambda b: plain_steps_run(b, build, step, steps=3),
                            claimed // 2, budget, 4096)
    assert truth - 4096 <= claimed <= truth * 1.05, (claimed, truth, advice.table())
