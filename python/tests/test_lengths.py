"""Variable-length data: the largest batch per length, and a sampler
that batches a dataset so that each batch, padded, fits."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import memfit
from memfit._step.batching import resize_length, sequence_length

BUDGET = 12 << 20
LENGTHS = [16, 32, 64]
VOCAB = 64


class TinyGPT(torch.nn.Module):
    """A causal transformer with eager attention (as GPT-2's): scores of
    length x length per head, saved for backward."""

    def __init__(self, d=32, heads=2, max_len=128):
        super().__init__()
        self.heads = heads
        self.tok = torch.nn.Embedding(VOCAB, d)
        self.pos = torch.nn.Embedding(max_len, d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d, d))
        self.head = torch.nn.Linear(d, VOCAB)

    def forward(self, x):
        b, n = x.shape
        h = self.tok(x) + self.pos(torch.arange(n))
        q, k, v = self.qkv(h).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        causal = torch.ones(n, n, dtype=torch.bool).triu(1)
        a = scores.masked_fill(causal, float("-inf")).softmax(-1) @ v
        h = h + self.proj(a.transpose(1, 2).reshape(b, n, -1))
        return self.head(h + self.mlp(h))


class LSTMTagger(torch.nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, d)
        self.lstm = torch.nn.LSTM(d, 2 * d, batch_first=True)
        self.head = torch.nn.Linear(2 * d, VOCAB)

    def forward(self, x):
        return self.head(self.lstm(self.tok(x))[0])


class TinyBert(torch.nn.Module):
    """An encoder of torch's TransformerEncoderLayer: SDPA, no scores kept."""

    def __init__(self, d=32, heads=2, max_len=128):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, d)
        self.pos = torch.nn.Embedding(max_len, d)
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d, VOCAB)

    def forward(self, x):
        return self.head(self.encoder(self.tok(x) + self.pos(torch.arange(x.shape[1]))))


def token_loss(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten(), ignore_index=-100)


def fit_model(make):
    torch.manual_seed(0)
    x = torch.randint(0, VOCAB, (4, 24))  # any length: cut or repeated to each
    return memfit.find_batch_size(make(), x, x.clone(), loss_fn=token_loss, optimizer="adam",
                                  budget=BUDGET, seq_dim=1, lengths=LENGTHS)


@pytest.fixture(scope="module")
def fits():
    return {make.__name__: fit_model(make) for make in (TinyGPT, LSTMTagger)}


def peak_at(make, batch, length):
    """The recorded peak of a whole step at `batch` x `length`."""
    torch.manual_seed(0)
    x = torch.randint(0, VOCAB, (batch, length))
    return memfit.profile(make(), x, x.clone(), loss_fn=token_loss, optimizer="adam").peak_bytes


def test_resize_length_cuts_or_repeats_tokens_and_leaves_class_labels():
    x = {"ids": torch.arange(12).reshape(2, 6), "mask": torch.ones(2, 6), "cls": torch.zeros(2)}
    assert sequence_length(x, 1) == 6
    longer = resize_length(x, 9, 1, 6)
    assert longer["ids"].shape == (2, 9) and longer["mask"].shape == (2, 9)
    assert longer["ids"][0].tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2]
    assert longer["cls"] is x["cls"]
    assert resize_length(x, 4, 1, 6)["ids"].shape == (2, 4)
    # Per input, as batch_dim: None for an input without a length.
    pair = resize_length((torch.zeros(2, 6, 3), torch.zeros(2, 6)), 3, (1, None), 6)
    assert pair[0].shape == (2, 3, 3) and pair[1].shape == (2, 6)
    with pytest.raises(ValueError, match=r"disagree on the length.*e\.g\. \(1, None\)"):
        sequence_length((torch.zeros(2, 6), torch.zeros(2, 5)), 1)
    # A dict batch takes a dict seq_dim: the message names one of its keys.
    with pytest.raises(ValueError, match=r"disagree on the length.*seq_dim=\{'ids': 1\}"):
        sequence_length({"ids": torch.zeros(2, 6), "pixels": torch.zeros(2, 3, 8)}, 1)


def test_the_fit_per_length_shrinks_with_the_length_and_every_length_is_verified(fits):
    for name, fit in fits.items():
        assert isinstance(fit, memfit.LengthFit)
        assert fit.lengths == LENGTHS and fit.verified, name
        batches = [fit.fits[n].max_batch for n in LENGTHS]
        assert batches == sorted(batches, reverse=True) and batches[-1] >= 1, (name, batches)
        for n in LENGTHS:
            assert fit.at(n) == fit.fits[n].max_batch
            assert fit.fits[n].measured_peak_bytes <= BUDGET
        assert fit.at(1) == fit.fits[16].max_batch  # below the shortest: its batch
        assert fit.max_tokens == min(fit.fits[n].max_batch * n for n in LENGTHS)
        table = fit.table()
        assert all(str(n) in table for n in LENGTHS) and "max_tokens" in table
        # Length 32 from the lines of 16 and 64: above (eager attention's
        # square is convex) or a hair below (the LSTM's rounded workspaces).
        assert -0.01 < fit.between_error < 0.1 and "between measured lengths" in table
        with pytest.raises(ValueError, match="above the longest measured, 64"):
            fit.at(65)


@pytest.mark.parametrize("make", [TinyGPT, LSTMTagger], ids=lambda m: m.__name__)
def test_between_measured_lengths_the_batch_fits_and_is_not_the_longer_ones(fits, make):
    fit = fits[make.__name__]
    for n in (24, 48):
        b = fit.at(n)
        assert fit.at(n, between="next") < b <= fit.at(n // 3 * 2)
        assert peak_at(make, b, n) <= BUDGET, (n, b)
    # Tight: a tenth more does not fit half way.
    assert peak_at(make, b + max(1, b // 10), 48) > BUDGET


def test_a_length_where_one_sample_does_not_fit_is_named():
    x = torch.randint(0, VOCAB, (2, 8))
    with pytest.raises(memfit.DoesNotFit, match=r"at length 1024: .*fitted so far: 16: "):
        memfit.find_batch_size(TinyGPT(max_len=1024), x, x.clone(), loss_fn=token_loss,
                               optimizer="adam", budget="2MiB", seq_dim=1, lengths=[16, 1024])


class Tagger(torch.nn.Module):
    """Takes a dict batch as Hugging Face models do: ids and a mask."""

    def __init__(self):
        super().__init__()
        self.inner = LSTMTagger()

    def forward(self, input_ids, attention_mask):
        return self.inner(input_ids) * attention_mask.unsqueeze(-1)


def test_a_dict_batch_and_its_token_labels_are_cut_or_repeated_together():
    ids = torch.randint(0, VOCAB, (2, 10))
    batch = {"input_ids": ids, "attention_mask": torch.ones(2, 10)}
    fit = memfit.find_batch_size(Tagger(), batch, ids.clone(), loss_fn=token_loss,
                                 optimizer="sgd", budget="4MiB", seq_dim=1, lengths=[8, 24])
    assert fit.lengths == [8, 24] and fit.verified
    assert fit.at(8) > fit.at(16) >= fit.at(24) >= 1
    with pytest.raises(ValueError, match=r"takes both seq_dim= .* and lengths="):
        memfit.find_batch_size(Tagger(), batch, ids, loss_fn=token_loss, budget="4MiB",
                               seq_dim=1)
    with pytest.raises(ValueError, match="no tensor has a dimension 2"):
        memfit.find_batch_size(Tagger(), batch, ids, loss_fn=token_loss, budget="4MiB",
                               seq_dim=2, lengths=[8])


class CapFit:
    """A fit without a model: at(L) samples of length L take `tokens`."""

    def __init__(self, tokens=256, longest=128):
        self.tokens, self.longest = tokens, longest

    def at(self, length):
        if length > self.longest:
            raise ValueError(f"length {length} is above the longest measured")
        return max(1, self.tokens // length)


def long_tailed(n, seed=0, low=4, high=128):
    g = torch.Generator().manual_seed(seed)
    drawn = torch.empty(n).log_normal_(math.log(24), 0.8, generator=g)
    return [int(v) for v in drawn.clamp(low, high).round()]


def test_the_sampler_covers_every_sample_once_and_each_batch_fits():
    lengths = long_tailed(1000)
    fit = CapFit()
    for drop_last in (False, True):
        sampler = memfit.LengthBatchSampler(lengths, fit, drop_last=drop_last, megabatch=8)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        seen = sorted(i for b in batches for i in b)
        for b in batches:
            assert len(b) <= fit.at(max(lengths[i] for i in b))
        short = [b for b in batches if len(b) < fit.at(max(lengths[i] for i in b))]
        if drop_last:
            assert not short and len(set(seen)) == len(seen) and len(seen) > 900
        else:
            assert seen == list(range(len(lengths))) and len(short) <= 1
    # The largest batch by memory (here: padded tokens) comes first.
    padded = [len(b) * max(lengths[i] for i in b) for b in batches]
    assert padded[0] == max(padded)


def test_the_sampler_is_deterministic_for_a_seed_and_set_epoch_reshuffles():
    lengths = long_tailed(500)

    def order(seed=0, epoch=0, shuffle=True):
        s = memfit.LengthBatchSampler(lengths, CapFit(), shuffle=shuffle, seed=seed)
        s.set_epoch(epoch)
        return list(s)

    assert order() == order()
    assert order(seed=1) != order()
    assert order(epoch=1) != order() and order(epoch=1) == order(epoch=1)
    assert order(shuffle=False) == order(shuffle=False, seed=5)
    with pytest.raises(ValueError, match="sample .* is 300 long"):
        memfit.LengthBatchSampler([10, 300], CapFit())


class Tokens(torch.utils.data.Dataset):
    def __init__(self, lengths, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.samples = [torch.randint(0, VOCAB, (n,), generator=g) for n in lengths]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def pad(samples):
    """Padded to the longest: ids with 0, labels with -100 (ignored)."""
    x = torch.nn.utils.rnn.pad_sequence(samples, batch_first=True)
    y = torch.nn.utils.rnn.pad_sequence(samples, batch_first=True, padding_value=-100)
    return x, y


@pytest.mark.parametrize("make", [TinyGPT, LSTMTagger], ids=lambda m: m.__name__)
def test_an_epoch_of_plain_steps_under_the_budget_never_runs_out_of_memory(fits, make):
    fit = fits[make.__name__]
    lengths = long_tailed(400, seed=1, high=64)
    sampler = memfit.LengthBatchSampler(lengths, fit, seed=3)
    loader = DataLoader(Tokens(lengths), batch_sampler=sampler, collate_fn=pad)
    with memfit.simulated_device(BUDGET):
        torch.manual_seed(0)
        model = make()
        opt = torch.optim.Adam(model.parameters())
        steps = 0
        for x, y in loader:  # an out-of-memory error fails the test
            assert x.shape[0] <= fit.at(x.shape[1])
            loss = token_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            steps += 1
            del x, y, loss
    assert steps == len(sampler)


@pytest.mark.parametrize("make", [TinyGPT, LSTMTagger], ids=lambda m: m.__name__)
def test_batches_hold_most_of_the_tokens_the_fit_allows(fits, make):
    # Per step: real tokens (not padding) against fit.at(L) * L at the
    # batch's padded length L, and against a fixed batch fit at the longest.
    fit = fits[make.__name__]
    lengths = long_tailed(2000, seed=1, high=64)
    batches = list(memfit.LengthBatchSampler(lengths, fit, seed=3))
    real = [sum(lengths[i] for i in b) for b in batches]
    allowed = [fit.at(max(lengths[i] for i in b)) * max(lengths[i] for i in b) for b in batches]
    mean = sum(real) / len(real)
    assert mean >= 0.85 * sum(allowed) / len(allowed), (mean, sum(allowed) / len(allowed))
    fixed = fit.at(fit.longest) * sum(lengths) / len(lengths)
    assert mean >= 1.5 * fixed, (mean, fixed)


# -- the surface over batch and length ------------------------------------------


def surface_of(make, lengths=(16, 32, 64), held_out=((6, 48), (10, 96))):
    torch.manual_seed(0)
    x = torch.randint(0, VOCAB, (3, 20))
    return memfit.length_surface(make(), x, x.clone(), seq_dim=1, lengths=lengths,
                                 held_out=held_out, loss_fn=token_loss, optimizer="adam")


@pytest.mark.parametrize("make", [TinyGPT, TinyBert, LSTMTagger], ids=lambda m: m.__name__)
def test_the_surface_predicts_held_out_shapes_within_two_percent(make):
    surface = surface_of(make)
    assert surface.per_event and len(surface.probes) == 6
    assert surface.held_out_error is not None and surface.held_out_error <= 0.02, surface.text()
    # Against a recording the surface never saw: batch and length outside.
    measured = peak_at(make, 5, 40)
    assert abs(surface.predict_peak_bytes(5, 40) - measured) <= 0.02 * measured
    assert "held out 10x96" in surface.text()


def test_the_surface_agrees_with_the_fit_and_says_when_it_lacks_the_square(fits):
    surface = surface_of(TinyGPT)
    fit = fits["TinyGPT"]
    for n in LENGTHS:
        assert abs(surface.max_batch(n, BUDGET) - fit.at(n)) <= max(1, 0.03 * fit.at(n))
    assert surface.max_batch(16, 1024) == 0
    # Eager attention grows with L^2; two lengths cannot see it, and say so.
    two = surface_of(TinyGPT, lengths=(16, 32), held_out=[(6, 64)])
    assert any("no L^2 term" in n for n in two.notes)
    assert two.held_out_error > 0.02 and "held out 6x64" in two.text()


# -- profile(..., seq_dim=): the report predicts over the length too ---------------


@pytest.mark.slow
def test_a_report_with_seq_dim_predicts_over_batch_and_length_with_its_held_out_error():
    torch.manual_seed(0)
    x = torch.randint(0, VOCAB, (4, 32))
    report = memfit.profile(TinyGPT(), x, x.clone(), loss_fn=token_loss, optimizer="adam",
                            seq_dim=1)
    assert report.batch == 4 and report.peak_bytes == peak_at(TinyGPT, 4, 32)
    # Batch and length both away from the example and from the probes
    # (8, 16, 32 long; 2 and 4 samples): eager attention's L^2 included.
    for b, n in ((6, 24), (3, 48)):
        measured = peak_at(TinyGPT, b, n)
        assert abs(report.predict_peak_bytes(b, length=n) - measured) <= 0.02 * measured, (b, n)
    p = report.prediction(6, length=24)
    assert p.predicted_bytes == report.predict_peak_bytes(6, length=24)
    assert p.held_out_error is not None and p.held_out_error <= 0.02
    assert not p.beyond_probes and "held-out shapes within" in p.text()
    assert report.length_surface().per_event
    # Along the batch alone, as before.
    assert report.predict_peak_bytes(8) == report.prediction(8).predicted_bytes
    with pytest.raises(ValueError, match=r"\[predict_peak_bytes\] .* profile\(\.\.\., seq_dim=1\)"):
        memfit.profile(TinyGPT(), x, x.clone(), loss_fn=token_loss).predict_peak_bytes(
            4, length=16)
    with pytest.raises(ValueError, match=r"\[profile\] no tensor has a dimension 2"):
        memfit.profile(TinyGPT(), x, x.clone(), loss_fn=token_loss, seq_dim=2)


# -- the trainers: each batch cut by its own length ---------------------------------


def padded_batches(lengths_per_batch, n, seed=0):
    """`n` samples per batch, each up to the batch's length, padded to it."""
    g = torch.Generator().manual_seed(seed)
    for longest in lengths_per_batch:
        sizes = torch.randint(max(1, longest - 8), longest + 1, (n,), generator=g).tolist()
        sizes[0] = longest
        yield pad([torch.randint(0, VOCAB, (k,), generator=g) for k in sizes])


def train_steps(trainer, lengths_per_batch, n):
    with memfit.simulated_device(BUDGET):
        reports = [trainer().step(x, y) for x, y in padded_batches(lengths_per_batch, n)]
    return reports


@pytest.mark.slow
def test_memfits_trainer_takes_each_batchs_micro_batch_from_its_length(fits):
    fit = fits["TinyGPT"]
    n = 200  # whole at 16 (fit: 260 or so), four micro-batches at 64 (about 51)
    assert fit.at(64) < n // 3 and n <= fit.at(16)
    lengths = [16, 64, 40, 64]

    def trainer(**kw):
        torch.manual_seed(0)
        model = TinyGPT()
        t = memfit.Trainer(model, torch.optim.Adam(model.parameters()), loss_fn=token_loss, **kw)
        return lambda: t

    reports = train_steps(trainer(seq_dim=1, lengths=fit), lengths, n)
    assert [r.ooms_recovered for r in reports] == [0, 0, 0, 0]
    assert reports[0].micro_batches == 1
    assert reports[1].micro_batches == -(-n // fit.at(64))  # no more than the fit needs
    assert all(r.samples == n for r in reports)
    # Without the lengths, the micro-batch planned at the first (short) batch
    # runs the long ones whole, and they run out of memory first.
    plain = train_steps(trainer(), lengths, n)
    assert plain[0].micro_batches == 1 and plain[1].ooms_recovered > 0
    # The sampler's fit serves too; the options go together.
    model = TinyGPT()
    sgd = torch.optim.SGD(model.parameters(), 0.1)
    sampler = memfit.LengthBatchSampler([16] * 10, fit)
    assert memfit.Trainer(model, sgd, loss_fn=token_loss, seq_dim=1,
                          lengths=sampler).length_fit is fit
    with pytest.raises(ValueError, match=r"\[Trainer\] a micro-batch per length takes both"):
        memfit.Trainer(model, sgd, loss_fn=token_loss, lengths=fit)


def test_max_tokens_caps_each_padded_batch_and_keeps_tokens_per_step_steady():
    lengths = long_tailed(2000, seed=2)
    sampler = memfit.LengthBatchSampler(lengths, CapFit(tokens=1024), max_tokens=256)
    batches = list(sampler)
    padded = [len(b) * max(lengths[i] for i in b) for b in batches]
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert max(padded) <= 256  # CapFit alone allows up to 1024
    # Full batches hold at least max_tokens less one sample of their length.
    full = [p for b, p in zip(batches, padded) if len(b) == 256 // max(lengths[i] for i in b)]
    assert len(full) >= len(batches) - 1
    assert all(p > 256 - max(lengths) for p in full)


@pytest.mark.parametrize("ranks, drop_last", [(3, False), (4, False), (3, True)])
def test_across_ranks_each_sample_comes_once_and_every_rank_steps_as_often(ranks, drop_last):
    lengths = long_tailed(997, seed=4)

    def share(rank, seed=0, epoch=0):
        s = memfit.LengthBatchSampler(lengths, CapFit(), seed=seed, drop_last=drop_last,
                                      num_replicas=ranks, rank=rank)
        s.set_epoch(epoch)
        return list(s)

    shares = [share(r) for r in range(ranks)]
    assert len({len(s) for s in shares}) == 1  # DDP steps in lockstep
    seen = sorted(i for s in shares for b in s for i in b)
    if drop_last:
        assert len(set(seen)) == len(seen) and len(seen) > 900
    else:
        assert seen == list(range(len(lengths)))
    for s in shares:
        assert all(len(b) <= CapFit().at(max(lengths[i] for i in b)) for b in s)
        padded = [len(b) * max(lengths[i] for i in b) for b in s]
        assert padded[0] == max(padded)  # each rank's largest first
    assert shares == [share(r) for r in range(ranks)]  # deterministic for the seed
    assert share(0, epoch=1) != shares[0]
    assert len(memfit.LengthBatchSampler(lengths, CapFit(), num_replicas=2, rank=1)) > 0
    with pytest.raises(ValueError, match=r"rank 2 is not below num_replicas=2"):
        memfit.LengthBatchSampler(lengths, CapFit(), num_replicas=2, rank=2)
    with pytest.raises(ValueError, match=r"3 ranks need a sample each, and the dataset has 2"):
        list(memfit.LengthBatchSampler([8, 9], CapFit(), num_replicas=3, rank=0))
    with pytest.raises(ValueError, match=r"4 batches of one sample each do not share evenly"):
        list(memfit.LengthBatchSampler([100] * 4, CapFit(tokens=100), num_replicas=3, rank=0))


@pytest.mark.slow
def test_the_trainer_fits_the_lengths_it_is_given_with_the_gradients_kept():
    torch.manual_seed(0)
    model = LSTMTagger()
    trainer = memfit.Trainer(model, torch.optim.Adam(model.parameters()), loss_fn=token_loss,
                             seq_dim=1, lengths=[8, 32])
    n, lengths = 200, [8, 32, 20]  # whole at 8 (about 220 fit), split at 32 (about 58)
    reports = train_steps(lambda: trainer, lengths, n)
    fit = trainer.length_fit  # measured before the first step, on its first two samples
    assert fit.lengths == [8, 32] and fit.verified, fit
    assert any("set_to_none=False" in note for f in fit.fits.values() for note in f.notes)
    assert [r.ooms_recovered for r in reports] == [0, 0, 0]
    assert [r.micro_batches for r in reports] == [-(-n // fit.at(k)) for k in lengths]
    assert reports[0].micro_batches == 1 < reports[1].micro_batches, fit


def test_a_prediction_below_every_probes_batch_says_the_probes_do_not_cover_it():
    torch.manual_seed(0)
    x = torch.randint(0, VOCAB, (4, 64))
    report = memfit.profile(TinyGPT(), x, x.clone(), loss_fn=token_loss, optimizer="adam",
                            seq_dim=1)
    one, two = report.prediction(1, length=64), report.prediction(2, length=64)
    # The probes record batches 2 and 4: batch 1 runs kernels they did not,
    # so their held-out error says nothing of it.
    assert one.beyond_probes and "below the smallest probe batch (2)" in one.text()
    assert not two.beyond_probes and "below" not in two.text()
