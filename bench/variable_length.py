"""One epoch of variable-length data under a simulated device:
memfit.LengthBatchSampler against a fixed batch fit at the median
length, a fixed batch fit at the longest length, and Hugging Face's
group_by_length at that batch.

Three models (a GPT-style decoder with eager attention, a BERT-style encoder
on torch's TransformerEncoderLayer, an LSTM tagger), a dataset of lengths
drawn lognormal and clipped to [16, longest], plain training steps (no memfit
recorder) under memfit.simulated_device(budget). Per method: steps, OOMs
(a step that runs out is skipped and counted), real tokens per completed
step (not padding), padded tokens per step, and for memfit the real tokens
over what the fit allows at each batch's length (fit.at(L) * L). Then
memfit.length_surface from 2 batches x 3 lengths, predicted against steps
recorded at two shapes outside them.

    PYTHONPATH=build/python .venv/bin/python bench/variable_length.py [--quick]
        [--models gpt,bert,lstm] [--budget 64MiB] [--samples 1000] [--longest 512]
"""

import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import memfit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _tables import md_table  # noqa: E402

VOCAB = 256


class GptBlock(nn.Module):
    """Eager attention, as GPT-2's: the scores (heads x L x L) are saved."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        causal = torch.ones(n, n, dtype=torch.bool).triu(1)
        y = att.masked_fill(causal, float("-inf")).softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, n, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, longest, width=64, heads=4, layers=2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, width), nn.Embedding(longest, width)
        self.blocks = nn.Sequential(*[GptBlock(width, heads) for _ in range(layers)])
        self.head = nn.Linear(width, VOCAB)

    def forward(self, ids):
        return self.head(self.blocks(self.tok(ids) + self.pos(torch.arange(ids.shape[1]))))


class Bert(nn.Module):
    """torch's TransformerEncoderLayer: SDPA, no scores saved on CPU."""

    def __init__(self, longest, width=64, heads=4, layers=2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, width), nn.Embedding(longest, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, ids):
        return self.head(self.encoder(self.tok(ids) + self.pos(torch.arange(ids.shape[1]))))


class LstmTagger(nn.Module):
    def __init__(self, longest, width=64):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, width)
        self.lstm = nn.LSTM(width, 2 * width, batch_first=True)
        self.head = nn.Linear(2 * width, VOCAB)

    def forward(self, ids):
        return self.head(self.lstm(self.tok(ids))[0])


MODELS = {"gpt": Gpt, "bert": Bert, "lstm": LstmTagger}


def token_loss(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten(), ignore_index=-100)


def draw_lengths(n, longest, seed=0):
    """Long-tailed: lognormal around 64 tokens, clipped to [16, longest]."""
    g = torch.Generator().manual_seed(seed)
    drawn = torch.empty(n).log_normal_(math.log(64), 1.0, generator=g)
    return [int(v) for v in drawn.clamp(16, longest).round()]


def pad(samples):
    x = nn.utils.rnn.pad_sequence(samples, batch_first=True)
    y = nn.utils.rnn.pad_sequence(samples, batch_first=True, padding_value=-100)
    return x, y


def fixed_batches(n, batch, seed):
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return [order[i:i + batch] for i in range(0, n, batch)]


def group_by_length(lengths, batch, seed):
    """Hugging Face's group_by_length (LengthGroupedSampler) at a fixed batch."""
    try:
        from transformers.trainer_pt_utils import LengthGroupedSampler
    except ImportError:
        return None
    g = torch.Generator().manual_seed(seed)
    order = list(LengthGroupedSampler(batch, lengths=lengths, generator=g))
    return [order[i:i + batch] for i in range(0, len(order), batch)]


def train_epoch(make, batches, samples, budget):
    """Plain steps on `batches` under the simulated device: (steps done,
    OOMs, real tokens per done step, padded tokens per done step)."""
    done, ooms, real, padded = 0, 0, [], []
    with memfit.simulated_device(budget):
        torch.manual_seed(0)
        model = make()
        opt = torch.optim.Adam(model.parameters())
        for idx in batches:
            x, y = pad([samples[i] for i in idx])
            try:
                token_loss(model(x), y).backward()
                opt.step()
                done += 1
                real.append(int((y != -100).sum()))
                padded.append(y.numel())
            except torch.OutOfMemoryError:
                ooms += 1
            opt.zero_grad(set_to_none=True)
            del x, y
    return done, ooms, real, padded


def mean(v):
    return sum(v) / len(v) if v else 0.0


def bench_model(name, args):
    longest = args.longest
    make = lambda: MODELS[name](longest)  # noqa: E731
    lengths = draw_lengths(args.samples, longest, seed=1)
    g = torch.Generator().manual_seed(2)
    samples = [torch.randint(0, VOCAB, (n,), generator=g) for n in lengths]
    median = sorted(lengths)[len(lengths) // 2]
    grid = sorted({16 * 2 ** k for k in range(12) if 16 * 2 ** k < longest} | {longest})
    torch.manual_seed(0)
    x = torch.randint(0, VOCAB, (2, 32))
    # train_epoch's loop drops the output once the loss exists: fit that loop.
    common = dict(loss_fn=token_loss, optimizer="adam", budget=args.budget, keep_output=False)

    t0 = time.perf_counter()
    fit = memfit.find_batch_size(make(), x, x.clone(), seq_dim=1, lengths=grid, **common)
    fit_s = time.perf_counter() - t0
    at_median = memfit.find_batch_size(make(), x, x.clone(), seq_dim=1, lengths=[median],
                                       **common).at(median)
    at_longest = fit.at(longest)

    methods = [
        (f"fixed batch {at_median} (fit at the median, {median})",
         fixed_batches(len(lengths), at_median, 3)),
        (f"fixed batch {at_longest} (fit at the longest, {longest})",
         fixed_batches(len(lengths), at_longest, 3)),
    ]
    hf = group_by_length(lengths, at_longest, 3)
    if hf is not None:
        methods.append((f"HF group_by_length, batch {at_longest}", hf))
    sampler = memfit.LengthBatchSampler(lengths, fit, seed=3)
    methods.append(("memfit.LengthBatchSampler", list(sampler)))

    rows, base = [], None
    for label, batches in methods:
        t0 = time.perf_counter()
        done, ooms, real, padded = train_epoch(make, batches, samples, args.budget)
        seconds = time.perf_counter() - t0
        tokens = mean(real)
        base = tokens if label.startswith(f"fixed batch {at_longest} ") else base
        rows.append([label, len(batches), ooms, f"{tokens:.0f}", f"{mean(padded):.0f}",
                     f"{sum(real) / max(1, sum(padded)):.2f}", f"{seconds:.1f}"])
        if label.startswith("memfit"):
            allowed = [fit.at(max(lengths[i] for i in b)) * max(lengths[i] for i in b)
                       for b in batches]
            memfit_tokens, memfit_allowed = tokens, mean(allowed)
    for r in rows:
        r.insert(6, f"{float(r[3]) / base:.2f}x" if base else "-")

    print(f"## {name}: {args.samples} samples, lengths 16..{longest} (median {median}), "
          f"budget {args.budget}\n")
    print(f"memfit fit over lengths {grid} in {fit_s:.1f} s:\n")
    print("    " + fit.table().replace("\n", "\n    ") + "\n")
    print(md_table(["method", "steps", "OOMs", "real tokens/step", "padded tokens/step",
                    "real/padded", "vs fixed at longest", "epoch s"], rows))
    print(f"\nmemfit: {memfit_tokens:.0f} real tokens per step = "
          f"{memfit_tokens / memfit_allowed:.2f} of what the fit allows at each batch's "
          f"length ({memfit_allowed:.0f})\n", flush=True)

    # The surface over (batch, length), checked where it was not probed.
    t0 = time.perf_counter()
    surface = memfit.length_surface(make(), x, x.clone(), seq_dim=1, lengths=[32, 64, 128],
                                    held_out=[(6, 96), (3, 200)], loss_fn=token_loss,
                                    optimizer="adam")
    print(f"memfit.length_surface in {time.perf_counter() - t0:.1f} s:\n")
    print("    " + surface.text().replace("\n", "\n    ") + "\n", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small run: 300 samples, to 256")
    ap.add_argument("--models", default="gpt,bert,lstm")
    ap.add_argument("--budget", default="64MiB")
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--longest", type=int, default=512)
    args = ap.parse_args(argv)
    if args.quick:
        args.samples, args.longest = min(args.samples, 300), min(args.longest, 256)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    for name in args.models.split(","):
        bench_model(name, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
