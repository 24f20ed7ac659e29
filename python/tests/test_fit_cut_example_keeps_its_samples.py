"""An example batch that runs out of memory is cut until a step runs; the
search then measures batches cut from the user's whole example, not the cut
one repeated. For a step whose memory follows the values (a sparse
Embedding's gradient with SparseAdam: its rows are the batch's distinct
tokens) repeated samples hold fewer distinct values than real ones: from
an example of 256 the answer was 295, unverified, on 128 samples repeated,
where plain steps run 187. Truth: plain steps of the user's loop on the
simulated device, on real (distinct) samples."""

import gc

import torch
import torch.nn.functional as F

import memfit
from memfit._native import tracked_live_bytes
from memfit.testing.truth import largest_that_fits, loop_body, plain_steps_run

VOCAB, WIDTH, LENGTH = 20000, 64, 32
BUDGET = 24 << 20


class SparseBag(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, WIDTH, sparse=True)
        self.head = torch.nn.Linear(WIDTH, 2)

    def forward(self, x):
        return self.head(self.emb(x).mean(1))


def _optimizers(model):
    return [torch.optim.SparseAdam(list(model.emb.parameters())),
            torch.optim.Adam(model.head.parameters())]


def _data(n):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, VOCAB, (n, LENGTH), generator=g), torch.randint(0, 2, (n,),
                                                                            generator=g)


def _runs(n):
    def build():
        model = SparseBag()
        return model, _optimizers(model), _data(n), {}

    def step(model, opts, xy, body):  # the quickstart's body
        loop_body(model, opts, *xy, F.cross_entropy, body)
    return plain_steps_run(BUDGET, build, step, steps=3)


def test_a_cut_example_is_searched_on_the_users_real_samples_and_verified():
    assert not _runs(256)  # the example itself does not fit: it is cut
    gc.collect()
    torch.manual_seed(0)
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        model = SparseBag()
        opts = _optimizers(model)
        x, y = _data(256)
        fit = memfit.find_batch_size(model, x, y, loss_fn=F.cross_entropy, optimizer=opts)
        del model, opts, x, y
    truth = largest_that_fits(_runs, fit.max_batch)
    assert fit.verified, fit.notes
    assert any(f"verified on the first {fit.max_batch} of your samples" in n
               for n in fit.notes), fit.notes
    assert truth * 0.9 <= fit.max_batch <= truth, (fit.max_batch, truth)
