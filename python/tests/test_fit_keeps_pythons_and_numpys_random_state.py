"""A step that augments its batch with Python's random or numpy's global
generator (a random flip, noise from np.random) draws from them in every
rehearsal memfit runs: afterwards both are where they were, as torch's
are, so the user's next step draws what it would have without memfit."""

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import memfit


def augmenting_step(model, batch):
    x, y = batch
    if random.random() < 0.5:
        x = x.flip(1)
    noise = torch.from_numpy(np.random.standard_normal(x.shape).astype("float32"))
    return F.cross_entropy(model(x + 0.1 * noise), y)


@pytest.mark.parametrize("how", ["cpu", "meta", "profile"])
def test_a_rehearsal_leaves_pythons_and_numpys_generators_where_they_were(how):
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    random.seed(1)
    np.random.seed(1)
    # What the user's next step draws without memfit.
    expected = random.random(), np.random.standard_normal(4)
    random.seed(1)
    np.random.seed(1)
    if how == "profile":
        memfit.profile(model, (x, y), step=augmenting_step, optimizer=opt)
    else:
        memfit.find_batch_size(model, (x, y), step=augmenting_step, optimizer=opt,
                               budget=1 << 20, mode=how)
    assert random.random() == expected[0]
    assert np.array_equal(np.random.standard_normal(4), expected[1])
