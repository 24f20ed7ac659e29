"""A fit per length whose longest length fits one sample: its search
verified batch 1 there and recorded batch 2 above the budget (a
rehearsal). The line at that length takes its slope from the two, so the
peak predicted at more samples grows with them (it stayed the one
sample's peak, whatever the batch), and between the lengths the batch
comes from the chord, checked, not the longer length's one sample. The
truth is plain training steps on a simulated device, not memfit."""

import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import plain_steps_run

BUDGET = 24 << 20
VOCAB = 50
LENGTHS = [16, 64, 560]


class EagerAttention(torch.nn.Module):
    """One attention layer that materialises its L x L scores: a peak that
    grows with the square of the length."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)
        self.head = torch.nn.Linear(d, VOCAB)
        self.heads = heads

    def forward(self, x):
        z = self.tok(x)
        b, n, d = z.shape
        q, k, v = self.qkv(z).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-1, -2) / 8).softmax(-1)
        z = z + self.out((a @ v).transpose(1, 2).reshape(b, n, d))
        return self.head(z)


def token_loss(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def make():
    torch.manual_seed(0)
    return EagerAttention()


def runs(batch, length, budget=BUDGET):
    def build():
        model = make()
        x = torch.randint(0, VOCAB, (batch, length))
        return model, torch.optim.Adam(model.parameters()), x, x.clone()

    def step(model, opt, x, y):
        token_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return plain_steps_run(budget, build, step)


def test_one_sample_at_the_longest_predicts_more_samples_and_batches_between_from_the_chord():
    torch.manual_seed(0)
    x = torch.randint(0, VOCAB, (4, 24))
    fit = memfit.find_batch_size(make(), x, x.clone(), loss_fn=token_loss, optimizer="adam",
                                 budget=BUDGET, seq_dim=1, lengths=LENGTHS)
    assert fit.fits[560].max_batch == 1 and fit.verified
    # Plain steps of two samples 560 long, and of ten 300 long, run within
    # the predicted peak (it was the one sample's 14.9 MiB for both, and
    # they take 29.5 and 43.2 MiB); at 560 the line is the measured one.
    for batch, length in ((2, 560), (10, 300)):
        predicted = fit.predict_peak_bytes(batch, length)
        assert predicted > fit.fits[560].measured_peak_bytes
        assert runs(batch, length, budget=predicted), (batch, length, predicted)
    assert not runs(2, 560, budget=int(fit.predict_peak_bytes(2, 560) * 0.99))
    # Between 64 and 560 the batch came from 560's one sample; now from the
    # chord, and plain steps run it.
    assert fit.at(65) > 50
    for length in (65, 100, 200, 400, 559):
        assert fit.at(length) >= 1
        assert runs(fit.at(length), length), length
