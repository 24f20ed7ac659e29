"""The scan of a padded training set for a sample longer than the first
batch (Note [A first batch shorter than the data]) reads samples that keep
a batch dimension of their own: tokenizer(text, return_tensors="pt") gives
(1, L) input_ids that the collate function concatenates. Their varying
dimension, 1, was taken for a sample's and moved to the batch's 2, which
the (B, L) batch has not: the scan gave up silently, the batch was fitted
at the first batch's 8 tokens, and plain steps at 96 ran out of memory.
The truth is plain training steps on a simulated device of the budget."""

import torch
import torch.nn.functional as F

import memfit
from memfit.integrations.length_batches import at_longest_sample
from memfit.testing.truth import plain_steps_run

VOCAB, SHORT, LONG = 50, 8, 96
BUDGET = 6 << 20
DATA = [{"input_ids": torch.full((1, LONG if i == 99 else SHORT), i % VOCAB)}
        for i in range(100)]


def pad(samples):
    n = max(s["input_ids"].shape[1] for s in samples)
    return {"input_ids": torch.cat([F.pad(s["input_ids"], (0, n - s["input_ids"].shape[1]))
                                    for s in samples])}


class Scorer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.tok = torch.nn.Embedding(VOCAB, 32)
        self.head = torch.nn.Linear(32, 1)

    def forward(self, input_ids):
        z = self.tok(input_ids)
        return self.head((z @ z.transpose(1, 2)).softmax(-1) @ z).mean()  # L x L


def step(model, batch):
    return model(**batch)


def runs(batch, length):
    def build():
        model = Scorer()
        return model, torch.optim.SGD(model.parameters(), lr=0.1), \
            torch.randint(0, VOCAB, (batch, length))

    def one(model, opt, ids):
        model(ids).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return plain_steps_run(BUDGET, build, one)


def test_samples_of_shape_1_by_length_are_scanned_and_the_batch_fits_the_longest():
    batch, note = at_longest_sample(DATA, pad, pad(DATA[:4]), "FitBatchSize")
    assert batch["input_ids"].shape == (4, LONG)
    assert note is not None and f"a training sample {LONG}" in note
    fit = memfit.find_batch_size(Scorer(), batch, step=step, optimizer="sgd", budget=BUDGET)
    assert runs(fit.max_batch, LONG)
