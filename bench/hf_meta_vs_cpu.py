"""Meta mode against a real CPU step on small transformers models (Llama,
GPT-2, BERT, T5) built with from_config: no weights, no hub. The same
model is profiled for real (mode="cpu", random weights) and on the meta
device (the model built under `torch.device("meta")`, meta inputs),
AdamW, two iterations.

    PYTHONPATH=build/python .venv/bin/python bench/hf_meta_vs_cpu.py [--quick] [--phases]

Prints each model's peak in both modes and the error, and with --phases the
peak of every phase of iteration 2 in both modes."""

import argparse
import sys

import torch

import memfit


def configs(t, quick, hidden=512, layers=2):
    """name -> (config, model class)."""
    h = 256 if quick else hidden
    n = 2 if quick else layers
    return {
        "llama": (t.LlamaConfig(num_hidden_layers=n, hidden_size=h, intermediate_size=2 * h + h // 2,
                                num_attention_heads=4, num_key_value_heads=4, vocab_size=8000,
                                max_position_embeddings=256), t.LlamaForCausalLM),
        "gpt2": (t.GPT2Config(n_layer=n, n_embd=h, n_head=4, vocab_size=8000, n_positions=256),
                 t.GPT2LMHeadModel),
        "bert": (t.BertConfig(num_hidden_layers=n, hidden_size=h, intermediate_size=4 * h,
                              num_attention_heads=4, vocab_size=8000,
                              max_position_embeddings=256), t.BertForMaskedLM),
        "t5": (t.T5Config(num_layers=n, num_decoder_layers=n, d_model=h, d_ff=4 * h, num_heads=4,
                          decoder_start_token_id=0, pad_token_id=0,
                          d_kv=h // 4, vocab_size=8000), t.T5ForConditionalGeneration),
    }


def inputs(batch, tokens, device):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 8000, (batch, tokens), generator=g).to(device)
    return {"input_ids": ids, "labels": ids.clone()}


def run(name, cfg, cls, batch, tokens, mode):
    cfg.use_cache = False  # training: no key/value cache
    torch.manual_seed(0)
    device = "meta" if mode == "meta" else "cpu"
    with torch.device(device):
        model = cls(cfg)
    model.train()
    x = inputs(batch, tokens, device)
    return memfit.profile(model, x, loss_fn=lambda out: out.loss,
                          optimizer=torch.optim.AdamW(model.parameters()), mode=mode)


def peaks(report, iteration=2):
    return {p["name"]: p["peak_bytes"] for p in report.phases if p["iteration"] == iteration}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="hidden 256, batch 2 x 64 tokens")
    ap.add_argument("--phases", action="store_true", help="every phase's peak, iteration 2")
    ap.add_argument("--models", default="llama,gpt2,bert,t5")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args(argv)
    try:
        import transformers
    except ImportError:
        print("[hf_meta_vs_cpu] transformers does not import: pip install transformers")
        return 0
    batch, tokens = (2, 64) if a.quick else (4, 128)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, batch {batch} x "
          f"{tokens} tokens, AdamW, fp32, two iterations, {2 if a.quick else a.layers} layers")
    print("| model | hidden | cpu peak | meta peak | meta - cpu | error | worst phase error |")
    print("|---|---|---|---|---|---|---|")
    worst_all = 0.0
    rows = []
    for name, (cfg, cls) in configs(transformers, a.quick, a.hidden, a.layers).items():
        if name not in a.models.split(","):
            continue
        cpu = run(name, cfg, cls, batch, tokens, "cpu")
        meta = run(name, cfg, cls, batch, tokens, "meta")
        assert meta.mode == "meta", meta.notes
        err = meta.peak_bytes / cpu.peak_bytes - 1
        pc, pm = peaks(cpu), peaks(meta)
        perr = {k: pm[k] / pc[k] - 1 for k in pc if pc[k]}
        wk = max(perr, key=lambda k: abs(perr[k]))
        worst_all = max(worst_all, abs(err))
        hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "d_model", None)
        print(f"| {name} | {hidden} | {cpu.peak_bytes / 2**20:.2f} MiB | "
              f"{meta.peak_bytes / 2**20:.2f} MiB | {meta.peak_bytes - cpu.peak_bytes:+,} B | {err:+.2%} | {wk} {perr[wk]:+.2%} |")
        rows.append((name, pc, pm))
    if a.phases:
        for name, pc, pm in rows:
            print(f"\n{name}, iteration 2: | phase | cpu peak | meta peak | error |")
            for k in pc:
                e = pm[k] / pc[k] - 1 if pc[k] else 0.0
                print(f"| {k} | {pc[k] / 2**20:.2f} MiB | {pm[k] / 2**20:.2f} MiB | {e:+.2%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
