"""Between measured lengths: a fit per length answers lengths it did not
measure from the lines of the ones it did. A model that pads inside
forward makes the peak jump between them; the fit checks each gap with a
step and, where it jumps, answers the longer length's batch. The truth is
plain training steps on a simulated device of the budget, not memfit."""

import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import plain_steps_run

BUDGET = 12 << 20
LENGTHS = [16, 64, 256]
VOCAB = 50


class TokenMLP(torch.nn.Module):
    """Per-token layers: a peak that grows with the tokens, convex."""

    def __init__(self, d=32):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 8 * d), torch.nn.GELU(),
                                       torch.nn.Linear(8 * d, d))
        self.head = torch.nn.Linear(d, VOCAB)

    def forward(self, x):
        return self.head(self.mlp(self.tok(x)))


class PadsToMultiple(TokenMLP):
    """Pads its tokens up to a multiple of 64 inside forward, as Longformer
    pads to its attention window: 65 tokens run as 128."""

    def forward(self, x):
        n = x.shape[1]
        return super().forward(F.pad(x, (0, -n % 64)))[:, :n]


def token_loss(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def fit(make, verify=True):
    torch.manual_seed(0)
    x = torch.randint(0, VOCAB, (4, 24))
    return memfit.find_batch_size(make(), x, x.clone(), loss_fn=token_loss, optimizer="adam",
                                  budget=BUDGET, seq_dim=1, lengths=LENGTHS, verify=verify)


def runs(make, batch, length):
    def build():
        torch.manual_seed(0)
        model = make()
        x = torch.randint(0, VOCAB, (batch, length))
        return model, torch.optim.Adam(model.parameters()), x

    def step(model, opt, x):
        token_loss(model(x), x).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return plain_steps_run(BUDGET, build, step)


def test_a_peak_that_jumps_inside_a_gap_gets_the_longer_lengths_batch_and_plain_steps_fit():
    unchecked, checked = fit(PadsToMultiple, verify=False), fit(PadsToMultiple)
    # The chord between 64 and 256 answers 65 tokens as if they were 65; the
    # model runs them as 128, and plain steps run out at that batch.
    assert unchecked.at(65) > checked.fits[256].max_batch
    assert not runs(PadsToMultiple, unchecked.at(65), 65)

    assert (64, 256) in checked.jumps
    assert any("between 64 and 256" in n and "pads inside forward" in n for n in checked.notes)
    for n in (65, 100, 129, 200, 255):
        assert checked.at(n) == checked.fits[256].max_batch
        assert runs(PadsToMultiple, checked.at(n), n), n
        # The prediction in a gap that jumps is the longer length's line: an
        # upper bound while the peak grows with the length.
        assert checked.predict_peak_bytes(checked.at(n), n) >= \
            checked.predict_peak_bytes(checked.at(n), 256) - 1


def test_a_convex_peak_passes_the_checks_and_keeps_the_chords_answers():
    unchecked, checked = fit(TokenMLP, verify=False), fit(TokenMLP)
    assert checked.jumps == ()
    assert any("checked one step past each shorter length" in n for n in checked.notes)
    for n in (17, 40, 65, 160, 255):
        assert checked.at(n) == unchecked.at(n)
        assert runs(TokenMLP, checked.at(n), n), n
    # Closer than the longer length's batch, which is what a jump would give.
    assert checked.at(65) > checked.fits[256].max_batch
    assert checked.at(17) > checked.fits[64].max_batch


def test_without_verify_no_gap_is_checked_and_the_fit_says_it_is_not_verified():
    unchecked = fit(PadsToMultiple, verify=False)
    assert unchecked.jumps == () and not unchecked.verified
    assert not any("checked one step" in n for n in unchecked.notes)
