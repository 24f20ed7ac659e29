"""bench/fit_corpus.py's true maximum: plain training steps on the simulated
device (no memfit recorder), found by bisection around a starting guess."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
fit_corpus = pytest.importorskip("fit_corpus")


def test_plain_step_truth_is_the_last_batch_whose_steps_run():
    spec = fit_corpus.corpus(quick=True, groups=["base"])[0]["mlp"]
    budget = 24 << 20  # the mlp and its Adam state hold about 11 MiB
    fits = lambda b: fit_corpus.plain_steps_fit(spec, b, budget)  # noqa: E731
    for start in (1, 40, 4000):
        truth = fit_corpus.true_max(fits, start)
        assert truth >= 1 and fits(truth) and not fits(truth + 1)
