"""A step whose memory depends on the batch's values (torch.unique, boolean
indexing, sparse gradients) is measured above the example batch on the
example's samples repeated: memfit says so, and does not call such an
answer verified (Note [Memory that depends on the batch's values])."""

import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import plain_steps_run

VOCAB, TOKENS = 20000, 20


class SparseBag(torch.nn.Module):
    """Token ids -> class: an embedding with sparse gradients, whose
    coalesced gradient and SparseAdam's state update hold a row per
    distinct id of the batch."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 64, sparse=True)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.emb(x).mean(1))


class DenseBag(SparseBag):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 64)


def ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, VOCAB, (n, TOKENS), generator=g),
            torch.randint(0, 10, (n,), generator=g))


def sparse_adam(model):
    return torch.optim.SparseAdam(list(model.emb.parameters()))


def test_a_fit_above_the_example_of_a_sparse_embedding_is_not_called_verified():
    budget = 20 << 20
    torch.manual_seed(0)
    model = SparseBag()
    x, y = ids(8, 0)
    fit = memfit.find_batch_size(model, x, y, optimizer=sparse_adam(model), budget=budget)
    assert fit.max_batch > 8
    assert not fit.verified
    line = [n for n in fit.notes if n.startswith("unverified: the step ran sparse gradients,")]
    assert line and f"pass an example of at least {fit.max_batch} real samples" in line[0], \
        fit.notes
    # Why: the user's own steps at that batch, on ids of their own (fresh
    # ones each step, as a loader gives), need more than the repeated 8
    # samples did, and run out of memory.
    seeds = iter(range(1, 100))

    def step(m, opt, n):
        xb, yb = ids(n, next(seeds))
        F.cross_entropy(m(xb), yb).backward()
        opt.step()
        opt.zero_grad()

    def build():
        torch.manual_seed(0)
        m = SparseBag()
        return m, sparse_adam(m), fit.max_batch

    assert not plain_steps_run(budget, build, step, steps=3)


def test_an_answer_within_the_example_is_verified_on_its_samples_and_says_so():
    torch.manual_seed(0)
    model = SparseBag()
    x, y = ids(512, 0)
    fit = memfit.find_batch_size(model, x, y, optimizer=sparse_adam(model), budget=20 << 20)
    assert 0 < fit.max_batch <= 512 and fit.verified
    assert any(n.startswith("the step ran sparse gradients,") and
               f"verified on the first {fit.max_batch} of your samples" in n
               for n in fit.notes), fit.notes


def test_a_dense_step_says_nothing_of_values():
    torch.manual_seed(0)
    model = DenseBag()
    x, y = ids(8, 0)
    report = memfit.profile(model, x, y, optimizer="adam")
    assert report.value_sized_ops == []
    assert not any("values" in n for n in report.notes)
    fit = memfit.find_batch_size(model, x, y, optimizer="adam", budget=40 << 20)
    assert fit.verified and not any("values" in n for n in fit.notes)


def test_profile_names_unique_and_boolean_indexing():
    class Unique(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(VOCAB, 64)
            self.head = torch.nn.Linear(64, 10)

        def forward(self, x):
            u, inverse = torch.unique(x, return_inverse=True)
            h = self.emb(u)[inverse].mean(1)
            return self.head(h[h.sum(-1) > -1e9])  # every row: a boolean index

    x, y = ids(8, 0)
    report = memfit.profile(Unique(), x, y, optimizer="adam")
    assert report.value_sized_ops == ["aten::_unique2", "aten::nonzero"]
    note = [n for n in report.notes if n.startswith("unsure beyond this batch")]
    assert note and "torch.unique, nonzero or boolean indexing" in note[0], report.notes
    with memfit.track() as t:
        torch.unique(x)
    assert t.value_sized_ops == ["aten::_unique2"]


def test_a_callbacks_batch_above_its_example_of_a_sparse_embedding_is_not_called_verified():
    # Lightning's and Hugging Face's callbacks size the batch through
    # plan_batch from two samples of the first batch, repeated.
    from memfit.integrations import api

    torch.manual_seed(0)
    model = SparseBag()
    how = api.UserStep(step=lambda m, b: F.cross_entropy(m(b[0]), b[1]), what="Callback")
    plan = api.plan_batch(model, ids(2, 0), sparse_adam(model), whole=api.LoopStep(how),
                          budget=20 << 20, what="Callback")
    fit = plan.fits[-1]
    assert plan.batch_size == fit.max_batch > 2 and not fit.verified
    assert any(n.startswith("unverified: the step ran sparse gradients,") for n in fit.notes)
