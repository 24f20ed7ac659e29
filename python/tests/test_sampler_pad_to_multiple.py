"""LengthBatchSampler(pad_to_multiple_of=m): the collate function pads each
batch to its longest sample rounded up to m (DataCollatorWithPadding's
pad_to_multiple_of=8), and each batch, so padded, runs plain steps under the
budget."""

import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import plain_steps_run

VOCAB, BUDGET, MULTIPLE = 100, 24 << 20, 64


class GRULM(torch.nn.Module):
    def __init__(self, d=48):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, d)
        self.rnn = torch.nn.GRU(d, 2 * d, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(2 * d, VOCAB)

    def forward(self, x):
        return self.head(self.rnn(self.tok(x))[0])


def token_loss(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def plain_steps(batch, length):
    def build():
        model = GRULM()
        x = torch.randint(0, VOCAB, (batch, length))
        return model, torch.optim.Adam(model.parameters()), x

    def step(model, opt, x):
        token_loss(model(x), x).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return plain_steps_run(BUDGET, build, step)


def test_each_batch_padded_to_the_multiple_runs_plain_steps_under_the_budget():
    torch.manual_seed(0)
    x = torch.randint(0, VOCAB, (4, 40))
    fit = memfit.find_batch_size(GRULM(), x, x.clone(), loss_fn=token_loss, optimizer="adam",
                                 budget=BUDGET, seq_dim=1, lengths=[32, 128, 512])
    lengths = [129] * 40 + [257] * 40
    sampler = memfit.LengthBatchSampler(lengths, fit, pad_to_multiple_of=MULTIPLE)
    shapes = {(len(b), -(-max(lengths[i] for i in b) // MULTIPLE) * MULTIPLE)
              for b in sampler}
    assert {n for _, n in shapes} == {192, 320}
    for batch, length in sorted(shapes):
        assert plain_steps(batch, length), (batch, length)
    assert sorted(i for b in sampler for i in b) == list(range(len(lengths)))
