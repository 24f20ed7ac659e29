"""The truth memfit's answers are checked against (memfit.testing.truth, used
by bench/fit_corpus.py and the tests): plain training steps on the simulated
device, no memfit recorder, and the largest batch that runs, found by
bisection around a starting guess."""

import gc

import pytest
import torch

from memfit.testing.models import Mlp
from memfit.testing.truth import largest_that_fits, plain_steps_run


@pytest.mark.slow  # three bisections of real steps: 70-80 s on 2 busy cores
def test_plain_step_truth_is_the_last_batch_whose_steps_run():
    budget = 24 << 20  # the mlp and its Adam state hold about 11 MiB

    def fits(b):
        def build():
            model = Mlp()
            return model, torch.optim.Adam(model.parameters()), b

        def step(model, opt, n):
            x, y = torch.randn(n, 28, 28), torch.randint(0, 10, (n,))
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()

        return plain_steps_run(budget, build, step)

    # Each of the searches' 60 or so fits() collects garbage twice; a
    # collection walks every object alive (0.1-0.4 s after the imports and
    # earlier tests of one process: most of this test's time). Collected
    # once and frozen, what was alive before the test is left out of each
    # walk: none of it becomes garbage here, so each fits() frees and counts
    # (tracked_live_bytes) the same bytes as without the freeze.
    gc.collect()
    gc.freeze()
    try:
        for start in (1, 40, 4000):
            truth = largest_that_fits(fits, start)
            assert truth >= 1 and fits(truth) and not fits(truth + 1)
    finally:
        gc.unfreeze()


def test_nothing_fits_is_zero():
    assert largest_that_fits(lambda b: False, 16) == 0
