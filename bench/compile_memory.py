"""memfit on torch.compile'd models: the warm compiled step's peak against
eager's, memfit's cold profile of the compiled model against it, the
compiled prediction at 2B against the compiled step measured at 2B, and
what the profile costs beyond compiling, in compiled steps.

For each model, in one process (inductor on the CPU, Adam, batch B):
- eager and compiled: the peak of a warm step (after two), measured with
  memfit.track around the step (the batch copied inside it) plus what lives
  across steps (weights, buffers, Adam's state);
- profile: memfit.profile of a freshly compiled model (torch._dynamo.reset()
  first: cold, memfit's call compiles it), its peak and its error against
  the warm compiled step; compile: the compile time memfit reports apart;
- 2B: report.prediction(2B) against the warm step of a model compiled
  afresh at 2B (reset first: the graph a user's run at 2B compiles);
- cost: (profile's wall time - its reported compile time) / a warm
  compiled step's time (median of 5, timed in the same run), the median
  of --repeat cold profiles (each after a reset); eager: the
  same profile of the eager model over an eager step, for scale (two
  recorded iterations and the copies around them);
- first 2: the user's own first two steps after compiling, in the same
  warm steps (a model compiled afresh by one forward, its backward compiled
  with it as memfit's warm-up does, then two plain steps timed): what any
  two iterations right after a compile cost, memfit's or the user's
  (the median of --repeat).
  ratio: cost / first 2;
- after 2: the user's own first two steps on the model memfit profiled
  (their own Adam, right after the profile), in the same steps: what the
  profile's first runs leave warm for them; net: cost + after 2 - first 2,
  what running the profile before the user's loop adds to it beyond
  compiling (their run with it less their run without it);
- again: the same profile of the compiled model once more, warm (nothing
  compiles, no warm-up), in the same steps: memfit's two recorded
  iterations, its copies and its report alone.

    PYTHONPATH=build/python .venv/bin/python bench/compile_memory.py [--repeat 3] [--json PATH]

Goals: profile within 1%, prediction at 2B within 2%, cost <= 3
compiled steps.
"""

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import memfit
from memfit.testing import models


Pointwise = models.Pointwise  # the model (width 256, 64 tokens)


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d, d))

    def forward(self, x):
        a = self.ln1(x)
        x = x + self.attn(a, a, a, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    def __init__(self, d=128, layers=2, heads=4, ctx=64, vocab=512):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.zeros(ctx, d))
        self.blocks = torch.nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, idx):
        return self.head(self.ln(self.blocks(self.emb(idx) + self.pos)))


class ResBlock(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(c)
        self.c2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


class ResNet(torch.nn.Module):
    def __init__(self, c=16, classes=10):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, c, 3, padding=1, bias=False),
                                        torch.nn.BatchNorm2d(c), torch.nn.ReLU())
        self.layers = torch.nn.Sequential(ResBlock(c), ResBlock(c),
                                          torch.nn.Conv2d(c, 2 * c, 3, stride=2, padding=1),
                                          ResBlock(2 * c))
        self.fc = torch.nn.Linear(2 * c, classes)

    def forward(self, x):
        return self.fc(self.layers(self.stem(x)).mean((2, 3)))


class ViT(torch.nn.Module):
    def __init__(self, d=128, layers=2, heads=4, patch=4, image=32, classes=10):
        super().__init__()
        self.patch = torch.nn.Conv2d(3, d, patch, stride=patch)
        self.pos = torch.nn.Parameter(torch.zeros((image // patch) ** 2, d))
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                                 norm_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d, classes)

    def forward(self, x):
        h = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.encoder(h).mean(1))


def _hf(kind):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    if kind == "gpt2":
        return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000,
                                          n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                          attn_pdrop=0.0))
    return LlamaForCausalLM(LlamaConfig(hidden_size=128, intermediate_size=256,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, vocab_size=1000,
                                        max_position_embeddings=64))


def _tokens(n, vocab, ctx, g):
    return torch.randint(0, vocab, (n, ctx), generator=g)


def _lm_batch(n, g):
    # labels a tensor of their own: the same tensor twice is a guard of its
    # own to dynamo (aliasing), and a copy of the batch would recompile.
    ids = _tokens(n, 1000, 64, g)
    return {"input_ids": ids, "labels": ids.clone()}


def hf_loss(out, target=None):
    return out.loss


def token_loss(logits, target):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


# name -> (model factory, batch(n, generator) -> (inputs, target), loss_fn, B)
MODELS = {
    "pointwise_mlp": (Pointwise, lambda n, g: (torch.randn(n, 64, 256, generator=g),
                                               torch.randint(0, 10, (n,), generator=g)),
                      None, 16),
    "gpt_blocks": (GPT, lambda n, g: (_tokens(n, 512, 64, g), _tokens(n, 512, 64, g)),
                   token_loss, 8),
    "resnet_cnn": (ResNet, lambda n, g: (torch.randn(n, 3, 32, 32, generator=g),
                                         torch.randint(0, 10, (n,), generator=g)), None, 16),
    "hf_gpt2": (lambda: _hf("gpt2"), lambda n, g: (_lm_batch(n, g), None), hf_loss, 8),
    "hf_llama": (lambda: _hf("llama"), lambda n, g: (_lm_batch(n, g), None), hf_loss, 8),
    "vit_encoder": (ViT, lambda n, g: (torch.randn(n, 3, 32, 32, generator=g),
                                       torch.randint(0, 10, (n,), generator=g)), None, 16),
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def _call(model, inputs):
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


def _loss(out, target, loss_fn):
    if loss_fn is not None:
        return loss_fn(out, target)
    if target.dtype == torch.int64:
        return F.cross_entropy(out, target)
    return F.mse_loss(out, target)


def _copy(obj):
    if isinstance(obj, dict):
        return {k: v.clone() for k, v in obj.items()}
    return None if obj is None else obj.clone()


def _step(model, opt, inputs, target, loss_fn):
    _loss(_call(model, inputs), target, loss_fn).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def warm(model, inputs, target, loss_fn, timed=0):
    """(peak of a warm step, median seconds of `timed` more warm steps)."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(2):
        _step(model, opt, inputs, target, loss_fn)
    resident = sum(t.nbytes for t in list(model.parameters()) + list(model.buffers())) + sum(
        v.nbytes for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    with memfit.track() as t:
        _step(model, opt, _copy(inputs), _copy(target), loss_fn)
    times = []
    for _ in range(timed):
        t0 = time.perf_counter()
        _step(model, opt, inputs, target, loss_fn)
        times.append(time.perf_counter() - t0)
    return resident + t.peak_bytes, statistics.median(times) if times else None


def first_steps(make, inputs, target, loss_fn):
    """Seconds of a plain training run's first two steps after compiling:
    the baseline for the profile's two recorded iterations."""
    from torch._functorch import config

    torch._dynamo.reset()
    model = torch.compile(fresh(make))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with config.patch(force_non_lazy_backward_lowering=True):
        _loss(_call(model, inputs), target, loss_fn)  # compiles; the backward with it
    t0 = time.perf_counter()
    for _ in range(2):
        _step(model, opt, inputs, target, loss_fn)
    return time.perf_counter() - t0


def steps_after_profile(model, inputs, target, loss_fn):
    """Seconds of the user's first two steps on a model memfit just
    profiled (their own optimizer, made now)."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    for _ in range(2):
        _step(model, opt, inputs, target, loss_fn)
    return time.perf_counter() - t0


def fresh(make):
    torch.manual_seed(0)
    return make()


def cold_profile(make, x, y, loss_fn):
    """memfit.profile of a model compiled afresh (its call compiles it):
    (the model, the report, the profile's seconds beyond compiling, the
    seconds of the user's first two steps after it)."""
    torch._dynamo.reset()
    model = torch.compile(fresh(make))
    t0 = time.perf_counter()
    report = memfit.profile(model, x, y, loss_fn=loss_fn, optimizer="adam")
    beyond_s = time.perf_counter() - t0 - report.compile.seconds
    return model, report, beyond_s, steps_after_profile(model, x, y, loss_fn)


def run(name, repeat):
    make, batch, loss_fn, b = MODELS[name]
    g = torch.Generator().manual_seed(0)
    x, y = batch(b, g)
    x2, y2 = batch(2 * b, g)
    eager_model = fresh(make)
    eager, eager_s = warm(eager_model, x, y, loss_fn, timed=5)
    t0 = time.perf_counter()
    memfit.profile(eager_model, x, y, loss_fn=loss_fn, optimizer="adam")
    eager_profile_s = time.perf_counter() - t0

    # The cold profile, the user's steps after it and their first steps
    # without it, `repeat` times each (the median): on 15-60 ms steps one
    # run moves by half a step with the machine.
    colds = [cold_profile(make, x, y, loss_fn) for _ in range(repeat)]
    model, report = colds[-1][:2]
    cost = report.compile
    beyond_s = statistics.median(c[2] for c in colds)
    after_s = statistics.median(c[3] for c in colds)
    # The same profile again: the model warm (nothing compiles, no warm-up
    # forward), what memfit's two recorded iterations cost on their own.
    t0 = time.perf_counter()
    memfit.profile(model, x, y, loss_fn=loss_fn, optimizer="adam")
    again_s = time.perf_counter() - t0
    # The warm step at B before the probes: after them the model's cache
    # holds their graph (batch dimension dynamic), which a call at B would
    # run instead of the static graph a training run at B compiles.
    compiled, step_s = warm(model, x, y, loss_fn, timed=5)
    t0 = time.perf_counter()
    predicted = report.prediction(2 * b).predicted_bytes
    predict_s = time.perf_counter() - t0

    firsts = [first_steps(make, x, y, loss_fn) for _ in range(repeat)]
    first_s = statistics.median(firsts)

    torch._dynamo.reset()
    at_2b, _ = warm(torch.compile(fresh(make)), x2, y2, loss_fn)
    return dict(
        model=name, batch=b, eager_peak=eager, compiled_peak=compiled,
        profile_peak=report.peak_bytes, profile_error=report.peak_bytes / compiled - 1,
        predicted_2b=predicted, measured_2b=at_2b, prediction_error=predicted / at_2b - 1,
        compile_s=cost.seconds, graphs=cost.graphs, graph_breaks=len(cost.graph_breaks),
        step_s=step_s, eager_step_s=eager_s, repeat=repeat,
        cost_steps=beyond_s / step_s, predict_s=predict_s,
        cost_each=[c[2] / step_s for c in colds],
        cost_range=[min(c[2] for c in colds) / step_s, max(c[2] for c in colds) / step_s],
        first_steps=first_s / step_s, again_steps=again_s / step_s,
        after_steps=after_s / step_s,
        net_steps=(beyond_s + after_s - first_s) / step_s,
        eager_cost_steps=eager_profile_s / eager_s,
        notes=[n for n in report.notes if n.startswith("compiled")],
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--repeat", type=int, default=3,
                    help="cold profiles and first steps per model (the median)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    fb = memfit.format_bytes
    rows = []
    for name in args.models.split(","):
        log(f"[compile_memory] {name}")
        rows.append(run(name, args.repeat))
    print(f"torch {torch.__version__}, inductor on the CPU, Adam, one thread")
    head = (f"{'model':<14} {'B':>3} {'eager':>10} {'compiled':>10} {'profile':>10} {'err':>7} "
            f"{'pred 2B':>10} {'meas 2B':>10} {'err':>7} {'compile':>8} {'graphs':>6} "
            f"{'cost':>6} {'first 2':>7} {'ratio':>5} {'after 2':>7} {'net':>5} {'again':>6} "
            f"{'eager':>6}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['model']:<14} {r['batch']:>3} {fb(r['eager_peak']):>10} "
              f"{fb(r['compiled_peak']):>10} {fb(r['profile_peak']):>10} "
              f"{r['profile_error']:>+7.2%} {fb(r['predicted_2b']):>10} "
              f"{fb(r['measured_2b']):>10} {r['prediction_error']:>+7.2%} "
              f"{r['compile_s']:>7.1f}s {r['graphs']:>3}/{r['graph_breaks']:<2} "
              f"{r['cost_steps']:>5.1f}x {r['first_steps']:>6.1f}x "
              f"{r['cost_steps'] / r['first_steps']:>5.2f} {r['after_steps']:>6.1f}x "
              f"{r['net_steps']:>4.1f}x {r['again_steps']:>5.1f}x "
              f"{r['eager_cost_steps']:>5.1f}x")
    worst = max(abs(r["profile_error"]) for r in rows)
    worst_pred = max(abs(r["prediction_error"]) for r in rows)
    worst_cost = max(r["cost_steps"] for r in rows)
    lows, highs = [r["cost_range"][0] for r in rows], [r["cost_range"][1] for r in rows]
    firsts = [r["first_steps"] for r in rows]
    ratios = [r["cost_steps"] / r["first_steps"] for r in rows]
    print(f"worst: profile {worst:.2%} (goal 1%), prediction at 2B {worst_pred:.2%} (goal 2%), "
          f"cost {worst_cost:.1f} compiled steps beyond compiling (goal 3; single profiles "
          f"{min(lows):.1f}-{max(highs):.1f})")
    nets = [r["net_steps"] for r in rows]
    print(f"the user's own first two steps after compiling: {min(firsts):.1f}-{max(firsts):.1f} "
          f"compiled steps; the profile's cost against them: {min(ratios):.2f}-{max(ratios):.2f}x")
    print(f"net: what the profile adds to the user's run beyond compiling, "
          f"{min(nets):.1f}-{max(nets):.1f} compiled steps")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
