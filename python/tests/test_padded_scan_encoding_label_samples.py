"""The scan of a padded training set for a sample longer than the first
batch (Note [A first batch shorter than the data]) reads samples that are
(encoding, label) pairs: a tuple whose first item is a mapping of ids.
Such samples gave no shape and the scan gave up silently, so the batch was
fitted at the first batch's length; a step at the longest sample is what
runs, and plain steps at the fitted batch ran out of memory there. The
truth is plain training steps on a simulated device of the budget."""

import torch
import torch.nn.functional as F

import memfit
from memfit.integrations.length_batches import at_longest_sample
from memfit.testing.truth import plain_steps_run

VOCAB, SHORT, LONG = 50, 8, 96
BUDGET = 6 << 20
DATA = [({"input_ids": [i % VOCAB] * (LONG if i == 99 else SHORT)}, i % 2) for i in range(100)]


def pad(samples):
    n = max(len(e["input_ids"]) for e, _ in samples)
    ids = torch.zeros(len(samples), n, dtype=torch.long)
    for i, (e, _) in enumerate(samples):
        ids[i, :len(e["input_ids"])] = torch.tensor(e["input_ids"])
    return {"input_ids": ids}, torch.tensor([label for _, label in samples])


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.tok = torch.nn.Embedding(VOCAB, 32)
        self.mix = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, 2)

    def forward(self, encoding):
        z = self.tok(encoding["input_ids"])
        scores = (z @ z.transpose(1, 2)).softmax(-1)  # L x L
        return self.head(self.mix(scores @ z).mean(1))


def step(model, batch):
    encoding, labels = batch
    return F.cross_entropy(model(encoding), labels)


def runs(batch, length):
    def build():
        model = Classifier()
        ids = torch.randint(0, VOCAB, (batch, length))
        return model, torch.optim.SGD(model.parameters(), lr=0.1), ids, torch.zeros(batch).long()

    def one(model, opt, ids, labels):
        F.cross_entropy(model({"input_ids": ids}), labels).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return plain_steps_run(BUDGET, build, one)


def test_encoding_label_samples_are_scanned_and_the_batch_fits_the_longest():
    first = pad(DATA[:4])
    batch, note = at_longest_sample(DATA, pad, first, "FitBatchSize")
    assert batch[0]["input_ids"].shape == (4, LONG) and torch.equal(batch[1], first[1])
    assert note is not None and f"a training sample {LONG}" in note
    fit = memfit.find_batch_size(Classifier(), batch, step=step, optimizer="sgd", budget=BUDGET)
    assert runs(fit.max_batch, LONG)
