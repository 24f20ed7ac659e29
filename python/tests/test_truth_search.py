"""memfit.testing.truth.largest_that_fits: the search for the largest batch
that runs, which the CPU truth (bench/fit_corpus.py, the tests) and the
card's plain-step truth (bench/gpu/native_check.py) both use."""

from memfit.testing.truth import largest_that_fits


def test_the_search_finds_the_largest_batch_that_runs_from_any_start():
    for limit, start in ((100, 100), (100, 37), (100, 400), (1, 5), (5000, 3)):
        tried = []

        def fits(b, n=limit):
            tried.append(b)
            return b <= n

        assert largest_that_fits(fits, start) == limit
        assert tried[0] == start
        assert len(tried) < 40


def test_the_search_answers_0_when_not_even_one_sample_runs():
    assert largest_that_fits(lambda b: False, 8) == 0
