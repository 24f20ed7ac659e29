"""find_batch_size on a corpus of architectures it was not built with: the
found batch against the true maximum (a search by plain training steps, no
memfit recorder, on memfit.simulated_device(budget); with --target cuda,
where there is no card, memfit's own allocator replay), the
overshoots (must be 0), the full-size trials, the prediction at a large
batch against the measured peak, and fit's cost in plain steps at its answer
(a ratio of times measured in the same run). Run with 1 and 2 threads: CPU kernels pick
their path (and their workspace) by batch and by thread count.

    PYTHONPATH=build/python .venv/bin/python bench/fit_corpus.py [--quick]
        [--groups base,tv,tvseg,timm,hf] [--only a,b] [--skip a,b] [--threads 1,2]
        [--target cuda]
    ... bench/fit_corpus.py --summarize LOG [LOG...]   # the summary of earlier runs' rows

Groups: base (memfit's twins, three hand-written conv nets, HF GPT-2, BERT,
Llama: what torch 2.13's CPU wheel runs), tv (torchvision's classification
models at 64x64), tvseg (torchvision's FCN, DeepLabV3, LR-ASPP heads), timm
(ConvNeXt, ViT, EfficientNet, ...) and hf (more Hugging Face models from
small configs: T5, ViT, Whisper's encoder; no weights, no hub). torchvision
and timm import only with the torch 2.14.1 CUDA wheel here (the CPU 2.13.0
wheel has no torchvision::nms); a group that does not import is skipped and
said so. Each model has its own budget batch B (the budget is the measured
peak at B; the prediction is checked at 2B): 96 for the small ones, less
for the heavy ones, so that the whole corpus runs on a 2-core CPU.
"""

import argparse
import gc
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memfit  # noqa: E402
from _peer_models import Spec, _classes, fit_specs, hf_specs  # noqa: E402
from memfit.testing.corpus_log import (COLUMNS, PLAIN_TRUTH, REPLAY_TRUTH,  # noqa: E402
                                       format_failed, format_row, rows_from_logs)
from memfit.testing.truth import largest_that_fits, plain_steps_run  # noqa: E402


class UNetish(nn.Module):
    """GroupNorm + SiLU conv blocks, down and up once, 32x32: the net whose
    per-sample memory changed with the batch (#15)."""

    def __init__(self, c=32):
        super().__init__()

        def block(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.GroupNorm(8, o), nn.SiLU(),
                                 nn.Conv2d(o, o, 3, padding=1), nn.GroupNorm(8, o), nn.SiLU())

        self.down, self.mid, self.up = block(3, c), block(c, 2 * c), block(3 * c, c)
        self.out = nn.Conv2d(c, 3, 1)

    def forward(self, x):
        d = self.down(x)
        m = self.mid(F.avg_pool2d(d, 2))
        u = F.interpolate(m, scale_factor=2.0)
        return self.out(self.up(torch.cat([u, d], 1)))


class Depthwise(nn.Module):
    """MobileNet-style depthwise-separable blocks with BatchNorm and ReLU6."""

    def __init__(self, c=32):
        super().__init__()
        layers = [nn.Conv2d(3, c, 3, stride=2, padding=1), nn.BatchNorm2d(c), nn.ReLU6()]
        for _ in range(3):
            layers += [nn.Conv2d(c, c, 3, padding=1, groups=c), nn.BatchNorm2d(c), nn.ReLU6(),
                       nn.Conv2d(c, 2 * c, 1), nn.BatchNorm2d(2 * c), nn.ReLU6()]
            c *= 2
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(c, 10)

    def forward(self, x):
        return self.head(self.body(x).mean((2, 3)))


class Residual(nn.Module):
    """Two ResNet basic blocks (BatchNorm, ReLU, skip), 32x32."""

    def __init__(self, c=32):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)

        def basic():
            return nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
                                 nn.ReLU(), nn.Conv2d(c, c, 3, padding=1, bias=False),
                                 nn.BatchNorm2d(c))

        self.b1, self.b2 = basic(), basic()
        self.head = nn.Linear(c, 10)

    def forward(self, x):
        h = self.stem(x)
        h = F.relu(h + self.b1(h))
        h = F.relu(h + self.b2(h))
        return self.head(h.mean((2, 3)))


def image(n):
    return torch.randn(n, 3, 32, 32)


def image64(n):
    return torch.randn(n, 3, 64, 64)


def _seg_loss(output, target):
    return F.cross_entropy(output["out"], target)


# torchvision classification models, 64x64 (inception_v3: 80x80, its
# smallest input is 75), 10 classes, no weights: name -> budget batch B.
# B is chosen from the model's cost (GFLOPs at 224x224, which scale by
# (64/224)^2 here) so that a fit and the search for the true maximum take
# about a minute on this 2-core machine: 96 up to ~1.8 GFLOPs, 64 to ~3,
# 32 to ~6, 16 to ~12. Cheapest first, so a run cut short has the most.
TV_CLASSIFICATION = {
    "mobilenet_v3_small": 96, "shufflenet_v2_x0_5": 96, "mnasnet0_5": 96,
    "squeezenet1_1": 96, "mnasnet0_75": 96, "shufflenet_v2_x1_0": 96,
    "mobilenet_v3_large": 96, "mobilenet_v2": 96, "mnasnet1_0": 96,
    "regnet_x_400mf": 96, "regnet_y_400mf": 96, "shufflenet_v2_x1_5": 96,
    "efficientnet_b0": 96, "mnasnet1_3": 96, "shufflenet_v2_x2_0": 96,
    "alexnet": 96, "squeezenet1_0": 96, "efficientnet_b1": 96, "regnet_x_800mf": 96,
    "regnet_y_800mf": 96, "efficientnet_b2": 96, "googlenet": 96, "resnet18": 96,
    "vit_b_32": 64, "regnet_x_1_6gf": 64, "regnet_y_1_6gf": 64, "efficientnet_b3": 64,
    "densenet121": 32, "regnet_x_3_2gf": 32, "regnet_y_3_2gf": 32, "densenet169": 32,
    "resnet34": 32, "resnet50": 32, "resnext50_32x4d": 32, "densenet201": 32,
    "efficientnet_b4": 32, "convnext_tiny": 32, "swin_t": 32, "vit_b_16": 32,
    "inception_v3": 32, "swin_v2_t": 16, "vgg11": 16, "vgg11_bn": 16, "resnet101": 16,
    "densenet161": 16, "regnet_x_8gf": 16, "regnet_y_8gf": 16, "efficientnet_v2_s": 16,
    "convnext_small": 16, "swin_s": 16, "efficientnet_b5": 16, "vgg13": 16,
    "vgg13_bn": 16, "wide_resnet50_2": 16, "resnet152": 16, "swin_v2_s": 16,
}

# Left out, and why (say so in the output: the corpus must not hide them).
TV_SKIPPED = {
    "maxvit_t": "its window partition needs inputs in multiples of 224 (7x7 windows at "
                "every stage): 64x64 does not run, 224x224 is too slow here",
    **{n: "over 150M parameters (Adam's state alone > 2.4 GB) and too slow on 2 cores"
       for n in ("vit_l_16", "vit_l_32", "vit_h_14", "regnet_y_128gf", "convnext_large")},
    **{n: "over ~15 GFLOPs at 224 (> 2 s per sample-step x the ~30 steps of a fit and "
          "its check): too slow on this shared 2-core CPU"
       for n in ("vgg16", "vgg16_bn", "vgg19", "vgg19_bn", "convnext_base", "swin_b",
                 "swin_v2_b", "efficientnet_b6", "efficientnet_b7", "efficientnet_v2_m",
                 "efficientnet_v2_l", "regnet_x_16gf", "regnet_x_32gf", "regnet_y_16gf",
                 "regnet_y_32gf", "resnext101_32x8d", "resnext101_64x4d",
                 "wide_resnet101_2")},
}


def tv_specs():
    import torchvision
    from torchvision import models

    specs = {}
    for name, b in TV_CLASSIFICATION.items():
        kw = dict(weights=None, num_classes=10)
        sample = image64
        if name in ("googlenet", "inception_v3"):
            kw.update(aux_logits=False, init_weights=False)
        if name == "inception_v3":
            sample = lambda n: torch.randn(n, 3, 80, 80)  # noqa: E731
        if name.startswith("vit_"):
            kw.update(image_size=64)
        spec = Spec(f"tv-{name}", lambda n=name, k=kw: models.get_model(n, **k), sample,
                    _classes, note=f"torchvision {torchvision.__version__}")
        spec.budget_batch = b
        specs[spec.name] = spec
    missing = set(models.list_models(module=models)) - set(TV_CLASSIFICATION) - set(TV_SKIPPED)
    assert not missing, f"torchvision models neither run nor skipped: {sorted(missing)}"
    return specs


def tvseg_specs():
    from torchvision.models import segmentation as seg

    def target(n):
        return torch.randint(0, 10, (n, 64, 64))

    specs = {}
    for name, b in (("lraspp_mobilenet_v3_large", 64), ("deeplabv3_mobilenet_v3_large", 32),
                    ("fcn_resnet50", 16), ("deeplabv3_resnet50", 16)):
        spec = Spec(f"tv-{name}", lambda n=name: getattr(seg, n)(
            weights=None, weights_backbone=None, num_classes=10, aux_loss=False),
            image64, target, _seg_loss, note="segmentation, 64x64, 10 classes")
        spec.budget_batch = b
        specs[spec.name] = spec
    return specs


def timm_specs():
    import timm

    specs = {}
    for name, kw, b in (("convnext_atto", {}, 96), ("vit_tiny_patch16_224", dict(img_size=64), 96),
                        ("vit_small_patch16_224", dict(img_size=64), 96),
                        ("efficientnet_b0", {}, 96), ("mobilenetv3_large_100", {}, 96),
                        ("deit_tiny_patch16_224", dict(img_size=64), 96),
                        ("resnet26d", {}, 32), ("convnext_pico", {}, 64)):
        spec = Spec(f"timm-{name}", lambda n=name, k=kw: timm.create_model(
            n, pretrained=False, num_classes=10, **k), image64, _classes,
            note=f"timm {timm.__version__}, 64x64")
        spec.budget_batch = b
        specs[spec.name] = spec
    return specs


class _HfCall(nn.Module):
    """Calls a Hugging Face model with one positional tensor as `key` (and,
    for encoder-decoders, the same ids as the decoder's input)."""

    def __init__(self, inner, key, seq2seq=False):
        super().__init__()
        self.inner, self.key, self.seq2seq = inner, key, seq2seq

    def forward(self, x):
        kw = {self.key: x}
        if self.seq2seq:
            kw["decoder_input_ids"] = x
        return self.inner(**kw)


def hf_more_specs(seq=32, vocab=1000):
    """T5, ViT and Whisper's encoder from small configs (no weights, no hub)."""
    import transformers
    from transformers import (T5Config, T5ForConditionalGeneration, ViTConfig,
                              ViTForImageClassification, WhisperConfig,
                              WhisperForAudioClassification)

    transformers.logging.set_verbosity_error()
    from _peer_models import _hf_causal_loss, _hf_cls_loss

    ids = lambda n: torch.randint(0, vocab, (n, seq))  # noqa: E731

    def t5():
        return _HfCall(T5ForConditionalGeneration(T5Config(
            vocab_size=vocab, d_model=128, d_kv=32, d_ff=256, num_layers=2,
            num_decoder_layers=2, num_heads=4, decoder_start_token_id=0, pad_token_id=0,
            eos_token_id=1, attn_implementation="eager")), "input_ids", seq2seq=True)

    def vit():
        return _HfCall(ViTForImageClassification(ViTConfig(
            image_size=64, patch_size=8, hidden_size=128, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=512, num_labels=10,
            attn_implementation="eager")), "pixel_values")

    def whisper():
        return _HfCall(WhisperForAudioClassification(WhisperConfig(
            num_mel_bins=80, d_model=128, encoder_layers=2, encoder_attention_heads=4,
            encoder_ffn_dim=256, decoder_layers=1, decoder_attention_heads=4,
            decoder_ffn_dim=256, max_source_positions=64, num_labels=10, vocab_size=vocab,
            attn_implementation="eager")), "input_features")

    specs = {
        "hf-t5": Spec("hf-t5", t5, ids, ids, _hf_causal_loss,
                      note=f"T5ForConditionalGeneration 2+2x128, seq {seq}"),
        "hf-vit": Spec("hf-vit", vit, image64, _classes, _hf_cls_loss,
                       note="ViTForImageClassification 2x128, 64x64, patch 8"),
        "hf-whisper-enc": Spec("hf-whisper-enc", whisper, lambda n: torch.randn(n, 80, 128),
                               _classes, _hf_cls_loss,
                               note="WhisperForAudioClassification (encoder) 2x128, 128 frames"),
    }
    return specs


GROUPS = ("base", "hf", "timm", "tvseg", "tv")


def corpus(quick, groups=GROUPS):
    """name -> Spec, in the order they run; and the groups that did not
    import (group -> why)."""
    specs, missing = {}, {}
    if "base" in groups:
        specs.update(fit_specs())
        specs["unet-gn-silu"] = Spec("unet-gn-silu", UNetish, image, image, F.mse_loss,
                                     note="GroupNorm+SiLU, 32x32")
        specs["depthwise"] = Spec("depthwise", Depthwise, image, _classes,
                                  note="MobileNet-style")
        specs["residual"] = Spec("residual", Residual, image, _classes, note="2 basic blocks")
        if not quick:
            hf, _ = hf_specs(seq=32)
            specs.update(hf)
    if quick:
        return specs, missing
    for group, make in (("hf", hf_more_specs), ("timm", timm_specs), ("tvseg", tvseg_specs),
                        ("tv", tv_specs)):
        if group not in groups:
            continue
        try:
            specs.update(make())
        except ImportError as e:
            missing[group] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        except RuntimeError as e:  # torchvision's ops on a torch without them
            missing[group] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    for heavy in ("tv-fcn_resnet50", "tv-deeplabv3_resnet50"):  # the slowest: last
        if heavy in specs:
            specs[heavy] = specs.pop(heavy)
    return specs, missing


def plain_steps_fit(spec, batch, budget, steps=2):
    """Whether `steps` plain training steps at `batch` (forward, loss,
    backward, Adam, zero_grad; no memfit recorder) run on a simulated device
    of `budget` bytes, the model, optimizer and batch made on it: the truth
    that does not rest on memfit's own measurement. The loop is PyTorch's
    quickstart, the one find_batch_size fits by default (keep_output):
    `pred` and `loss` stay alive until the next iteration assigns them."""

    def build():
        model = spec.model()
        return model, torch.optim.Adam(model.parameters(), lr=1e-3), spec.batch(batch), {}

    def step(model, opt, xy, body):  # body: the for-loop's locals
        body["pred"] = model(xy[0])
        body["loss"] = spec.loss(body["pred"], xy[1])
        body["loss"].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return plain_steps_run(budget, build, step, steps)


def measure(spec, threads, budget_batch, target="cpu"):
    torch.set_num_threads(threads)
    budget_batch = getattr(spec, "budget_batch", budget_batch)
    model = spec.model()
    x, y = spec.batch(8)
    report = memfit.profile(model, x, y, loss_fn=spec.loss, optimizer="adam",
                            target_device=target)
    cache = {}

    def at(b):  # each batch's step recorded once
        if b not in cache:
            cache[b] = report.at_batch(b)
        return cache[b]

    def peak(b):  # for a card: the caching allocator's reserve, replayed
        return at(b).budget_peak_bytes

    budget = peak(budget_batch)  # a budget near budget_batch
    t0 = time.perf_counter()
    fit = memfit.find_batch_size(model, x, y, loss_fn=spec.loss, optimizer="adam", budget=budget,
                                 target_device=target)
    fit_s = time.perf_counter() - t0
    if target == "cpu":  # plain steps under the simulated device
        truth = largest_that_fits(lambda b: plain_steps_fit(spec, b, budget), fit.max_batch)
        overshoot = fit.max_batch > truth
    else:  # no card here: memfit's own allocator replay (see the header line)
        truth = largest_that_fits(lambda b: peak(b) <= budget, fit.max_batch)
        overshoot = peak(fit.max_batch) > budget
    large = 2 * budget_batch
    sure = report.prediction(large)
    predicted, actual = sure.predicted_bytes, at(large).peak_bytes
    if target == "cuda" and sure.predicted_reserved_bytes >= 0:
        predicted, actual = sure.predicted_reserved_bytes, peak(large)
    # memfit measuring itself (its recorder's peak at its own answer): recorded
    # only to explain an overshoot.
    return dict(found=fit.max_batch, truth=truth, overshoot=overshoot,
                self_over_bytes=peak(fit.max_batch) - budget if overshoot else 0,
                trials=fit.trials, affine=fit.affine, large=large,
                cost=fit_s / plain_step_seconds(spec, fit.max_batch),
                pred_err=(predicted - actual) / actual)


def plain_step_seconds(spec, batch):
    """One plain training step at `batch` (forward, loss, backward, Adam,
    zero_grad), untracked: the unit of fit's planning cost. Best of 3."""
    model = spec.model(seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = spec.batch(batch)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        spec.loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        best = min(best, time.perf_counter() - t0)
    return best


def summary(rows, label):
    if not rows:
        print(f"{label}: no fits")
        return
    ratios = [r["found"] / r["truth"] for _, _, r in rows]
    errs = [abs(r["pred_err"]) for _, _, r in rows]
    worst = max(rows, key=lambda row: abs(row[2]["pred_err"]))
    print(f"{label}: {len(rows)} fits ({len({n for n, _, _ in rows})} models): overshoots "
          f"{sum(r['overshoot'] for _, _, r in rows)}, "
          f"mean found/true {statistics.mean(ratios):.4f} (min {min(ratios):.4f}), "
          f"median |prediction error| at 2B {100 * statistics.median(errs):.2f}% "
          f"(mean {100 * statistics.mean(errs):.2f}%), worst "
          f"{100 * abs(worst[2]['pred_err']):.2f}% ({worst[0]}, {worst[1]} thread(s)); "
          f"trials median {statistics.median(r['trials'] for _, _, r in rows)}, max "
          f"{max(r['trials'] for _, _, r in rows)}; fit's cost, median "
          f"{statistics.median(r['cost'] for _, _, r in rows):.1f} plain steps at its answer "
          f"(its probes, the first profile at the example batch, and the verifying steps)",
          flush=True)


def report(rows, failed, threads_list):
    print()
    for threads in threads_list:
        summary([row for row in rows if row[1] == threads], f"{threads} thread(s)")
    summary(rows, "all")
    print("\nworst prediction errors at 2B:")
    for name, threads, r in sorted(rows, key=lambda row: -abs(row[2]["pred_err"]))[:6]:
        print(f"  {name} ({threads} thr): {100 * r['pred_err']:+.2f}%")
    print("lowest found/true:")
    for name, threads, r in sorted(rows, key=lambda row: row[2]["found"] / row[2]["truth"])[:6]:
        print(f"  {name} ({threads} thr): {r['found']}/{r['truth']} = "
              f"{r['found'] / r['truth']:.3f}, trials {r['trials']}, affine {r['affine']}")
    for name, threads, r in rows:
        if r["overshoot"]:
            print(f"OVERSHOOT {name} ({threads} thr): batch {r['found']} is above the true "
                  f"maximum {r['truth']} (memfit's own recorder: {r['self_over_bytes']:+} B "
                  f"against the budget)")
    for name, threads, why in failed:
        print(f"failed {name} ({threads} thr): {why}")
    return 1 if any(r["overshoot"] for _, _, r in rows) else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--groups", default=",".join(GROUPS),
                    help=f"comma-separated, of {', '.join(GROUPS)}")
    ap.add_argument("--only", help="comma-separated model names (as printed)")
    ap.add_argument("--skip", help="comma-separated model names not to run")
    ap.add_argument("--threads", default=None, help="e.g. 1,2 (default: 1 with --quick, else 1,2)")
    ap.add_argument("--target", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: budgets, answers and predictions in a card's reserved bytes "
                         "(the caching allocator replayed on each step)")
    ap.add_argument("--summarize", nargs="+", metavar="LOG",
                    help="run nothing: the summary of the rows these logs of earlier runs print")
    args = ap.parse_args()
    if args.summarize:
        rows = rows_from_logs(args.summarize)
        return report(rows, [], sorted({t for _, t, _ in rows}))
    budget_batch = 48 if args.quick else 96
    threads_list = ([int(t) for t in args.threads.split(",")] if args.threads
                    else [1] if args.quick else [1, 2])
    specs, missing = corpus(args.quick, args.groups.split(","))
    if args.only:
        wanted = args.only.split(",")
        specs = {k: v for k, v in specs.items() if k in wanted}
    if args.skip:
        specs = {k: v for k, v in specs.items() if k not in args.skip.split(",")}
    print(f"torch {torch.__version__}; {len(specs)} models, threads {threads_list}; "
          f"budget = the measured peak at B, prediction checked at 2B; true max: "
          f"{PLAIN_TRUTH if args.target == 'cpu' else REPLAY_TRUTH}"
          f"{'; a CUDA card: reserved bytes (the prediction: allocated bytes where the two largest probes allocate differently)' if args.target == 'cuda' else ''}",
          flush=True)
    for group, why in missing.items():
        print(f"group {group} skipped: {why}", flush=True)
    if "tv" in args.groups.split(",") and "tv" not in missing and not args.only:
        for name, why in TV_SKIPPED.items():
            print(f"skipped {name}: {why}", flush=True)
    rows, failed = [], []
    print(COLUMNS, flush=True)
    for name, spec in specs.items():
        for threads in threads_list:
            t0 = time.perf_counter()
            try:
                r = measure(spec, threads, budget_batch, args.target)
            except Exception as e:  # noqa: BLE001 (report and go on: a corpus run is long)
                failed.append((name, threads, f"{type(e).__name__}: {str(e)[:200]}"))
                print(format_failed(*failed[-1]), flush=True)
                continue
            finally:
                gc.collect()
            rows.append((name, threads, r))
            print(format_row(name, threads, r, time.perf_counter() - t0), flush=True)
    return report(rows, failed, threads_list)


if __name__ == "__main__":
    sys.exit(main())
