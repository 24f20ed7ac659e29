"""Meta mode with torch's C++ meta kernels (memfit's default, Note [Native
meta kernels]) against torch's Python meta kernels, in the same run: the
time of one meta profile of each small transformers model (Llama, GPT-2,
BERT, T5 from hf_meta_vs_cpu's configs) and a Llama with --layers blocks,
and whether the two reports agree byte for byte (every phase's peak and
live bytes, both iterations).

    PYTHONPATH=build/python .venv/bin/python bench/native_meta.py [--quick]
        [--runs 3 --hidden 512 --layers 2] [--llm-settings]

--llm-settings: also bench/llm_settings.py's whole advise (an 8B Llama
for a 24 GiB card, ~1 min with the Python kernels) once each way: its
time, and whether the table and plan print the same.
--corpus base,tv,tvseg,timm,hf [--every 3]: also the models of
bench/fit_corpus.py (every k-th; timm and torchvision import with torch
2.14.1 here), each profiled once each way at batch 4 for a CUDA target:
equal reports and the time of each.

The baseline swaps memfit's NativeMetaKernels for a context that registers
nothing, so torch's Python kernels answer, as they did before. Runs
alternate (python, native, python, ...); the ratio is of medians.
--quick: hidden 256, 1 run each."""

import argparse
import contextlib
import io
import re
import statistics
import sys
import time

import torch

import memfit
from memfit._step import meta_reads

import llm_settings
from hf_meta_vs_cpu import configs, inputs

NATIVE = meta_reads._memfit.NativeMetaKernels


@contextlib.contextmanager
def kernels(kind):
    """kind 'python': nothing is registered, torch's Python kernels answer."""
    meta_reads._memfit.NativeMetaKernels = NATIVE if kind == "native" else contextlib.nullcontext
    try:
        yield
    finally:
        meta_reads._memfit.NativeMetaKernels = NATIVE


def profile_meta(cfg, cls, batch, tokens):
    cfg.use_cache = False
    with torch.device("meta"):
        model = cls(cfg)
    model.train()
    x = inputs(batch, tokens, "meta")
    t0 = time.perf_counter()
    r = memfit.profile(model, x, loss_fn=lambda out: out.loss,
                       optimizer=torch.optim.AdamW(model.parameters()), mode="meta")
    return time.perf_counter() - t0, r


def figures(report):
    assert report.mode == "meta", report.notes
    return [(p["name"], p["iteration"], p["peak_bytes"], p["live_bytes_after"])
            for p in report.phases]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--models", default="llama,gpt2,bert,t5")
    ap.add_argument("--llm-settings", action="store_true",
                    help="also the 8B advise of bench/llm_settings.py, once each way")
    ap.add_argument("--corpus", default=None, help="fit_corpus.py groups, e.g. base,tv,timm")
    ap.add_argument("--every", type=int, default=1, help="with --corpus: every k-th model")
    a = ap.parse_args(argv)
    try:
        import transformers
    except ImportError:
        print("[native_meta] transformers does not import: pip install transformers")
        return 0
    runs = 1 if a.quick else a.runs
    batch, tokens = 4, 128
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}; meta profile, "
          f"AdamW, batch {batch} x {tokens}, {a.layers} layers, {runs} run(s) each, medians")
    print("| model | python kernels | C++ kernels | python / C++ | reports equal |")
    print("|---|---|---|---|---|")
    all_equal = True
    for name, (cfg, cls) in configs(transformers, a.quick, a.hidden, a.layers).items():
        if name not in a.models.split(","):
            continue
        times = {"python": [], "native": []}
        seen = {}
        for _ in range(runs):
            for kind in ("python", "native"):
                with kernels(kind):
                    t, r = profile_meta(cfg, cls, batch, tokens)
                times[kind].append(t)
                seen[kind] = figures(r)
        py, nat = statistics.median(times["python"]), statistics.median(times["native"])
        equal = seen["python"] == seen["native"]
        all_equal &= equal
        print(f"| {name} | {py:.2f} s | {nat:.2f} s | {py / nat:.1f}x | "
              f"{'yes' if equal else 'NO'} |")
    if a.llm_settings:
        all_equal &= advise_8b()
    if a.corpus:
        all_equal &= corpus_models(a.corpus.split(","), a.every)
    return 0 if all_equal else 1


def corpus_models(groups, every):
    """fit_corpus.py's models (every k-th), one meta profile each way."""
    import fit_corpus

    specs, missing = fit_corpus.corpus(False, groups)
    for group, why in missing.items():
        print(f"group {group} skipped: {why}")
    names = list(specs)[::every]
    print(f"\n| corpus model | python kernels | C++ kernels | python / C++ | reports equal |")
    print("|---|---|---|---|---|")
    differ = 0
    for name in names:
        spec = specs[name]
        model = spec.model()
        x, y = spec.batch(4)
        seen, took = {}, {}
        for kind in ("python", "native"):
            with kernels(kind):
                t0 = time.perf_counter()
                r = memfit.profile(model, x, y, loss_fn=spec.loss, optimizer="adam", mode="meta",
                                   target_device="cuda")
                took[kind] = time.perf_counter() - t0
            seen[kind] = (figures(r), r.budget_peak_bytes)
        equal = seen["python"] == seen["native"]
        differ += not equal
        print(f"| {name} | {took['python']:.2f} s | {took['native']:.2f} s | "
              f"{took['python'] / took['native']:.1f}x | {'yes' if equal else 'NO'} |", flush=True)
    print(f"{len(names) - differ} of {len(names)} reports equal")
    return differ == 0


def advise_8b():
    """llm_settings.py's advise with each kind of kernel: seconds, same text."""
    took, text = {}, {}
    for kind in ("python", "native"):
        out = io.StringIO()
        with kernels(kind), contextlib.redirect_stdout(out):
            llm_settings.main([])
        printed = out.getvalue()
        took[kind] = float(re.search(r"\(memfit.advise took ([\d.]+) s\)", printed).group(1))
        text[kind] = re.sub(r"\(memfit.advise took [\d.]+ s\)", "", printed)
    equal = text["python"] == text["native"]
    print(f"\nllm_settings.py (8B Llama, 24 GiB card), memfit.advise: python kernels "
          f"{took['python']:.1f} s, C++ kernels {took['native']:.1f} s, "
          f"{took['python'] / took['native']:.1f}x; table and plan the same: "
          f"{'yes' if equal else 'NO'}")
    return equal


if __name__ == "__main__":
    sys.exit(main())
