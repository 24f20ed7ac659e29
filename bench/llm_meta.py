"""A Llama-7B-shaped training step planned on the meta device: no weights, no
GPU, no real memory. The model is transformers' LlamaForCausalLM built with
from_config under `torch.device("meta")`; memfit.profile runs forward, loss,
backward, AdamW's step and zero_grad twice in meta mode, with the CUDA
caching allocator's estimate.

    PYTHONPATH=build/python .venv/bin/python bench/llm_meta.py [--quick]
        [--layers 32 --hidden 4096 --intermediate 11008 --vocab 32000
         --batch 1 --tokens 2048]

Prints the time of the profile, the process's peak resident memory, and the
parameter, gradient and AdamW-state bytes beside the closed form (4 bytes per
parameter each; exp_avg and exp_avg_sq are two), then memfit's report, then
each strategy's estimated step time from FLOPs counted on meta and bytes
moved (memfit.estimate_costs).
--quick: 2 layers, hidden 512, 256 tokens."""

import argparse
import resource
import sys
import time

import torch

import memfit


def rss_gib():
    """The process's peak resident memory so far (Linux: ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def phase_delta(report, name, iteration=1):
    return [p["delta_bytes"] for p in report.phases
            if p["name"] == name and p["iteration"] == iteration][0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 layers, hidden 512, 256 tokens")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=11008)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=2048)
    a = ap.parse_args(argv)
    if a.quick:
        a.layers, a.hidden, a.intermediate, a.heads, a.tokens = 2, 512, 1376, 4, 256
    try:
        import transformers
    except ImportError:
        print("[llm_meta] transformers does not import: pip install transformers")
        return 0
    cfg = transformers.LlamaConfig(
        num_hidden_layers=a.layers, hidden_size=a.hidden, intermediate_size=a.intermediate,
        vocab_size=a.vocab, num_attention_heads=a.heads, num_key_value_heads=a.heads,
        max_position_embeddings=a.tokens)
    rss_before = rss_gib()
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    ids = torch.zeros(a.batch, a.tokens, dtype=torch.long, device="meta")
    optimizer = torch.optim.AdamW(model.parameters())
    t1 = time.perf_counter()
    report = memfit.profile(model, {"input_ids": ids, "labels": ids},
                            loss_fn=lambda out: out.loss, optimizer=optimizer, mode="meta",
                            target_device="cuda")
    t2 = time.perf_counter()

    n = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    closed = 4 * n  # fp32: 4 bytes per parameter
    measured = {
        "parameters": phase_delta(report, "parameters") - buffers,
        "gradients": -phase_delta(report, "zero_grad"),
        "AdamW state": phase_delta(report, "optimizer_step"),
    }
    expected = {"parameters": closed, "gradients": closed, "AdamW state": 2 * closed}
    print(f"torch {torch.__version__}, transformers {transformers.__version__}: "
          f"LlamaForCausalLM {a.layers} layers, hidden {a.hidden}, intermediate "
          f"{a.intermediate}, vocab {a.vocab}, batch {a.batch} x {a.tokens} tokens, AdamW, fp32")
    print(f"{n:,} parameters; model built on meta in {t1 - t0:.2f} s; "
          f"memfit.profile(mode='meta', target_device='cuda') in {t2 - t1:.2f} s; "
          f"peak host RSS {rss_gib():.2f} GiB (before the model: {rss_before:.2f} GiB)")
    print()
    print("| model state | measured bytes | closed form (4 B/param each) | equal |")
    print("|---|---|---|---|")
    for k, v in measured.items():
        print(f"| {k} | {v:,} | {expected[k]:,} | {'yes' if v == expected[k] else 'NO'} |")
    total = sum(measured.values())
    print(f"| weights+grads+2 Adam states | {total:,} ({memfit.format_bytes(total)}) | "
          f"{4 * closed:,} (4 x params x 4 B) | {'yes' if total == 4 * closed else 'NO'} |")
    print()
    print(report.table(8))
    t3 = time.perf_counter()
    rows = memfit.estimate_costs(model, {"input_ids": ids, "labels": ids},
                                 loss_fn=lambda out: out.loss)
    print()
    print(f"Time without running (FLOPs counted on meta in {time.perf_counter() - t3:.2f} s; "
          f"estimates, see Note [Time estimated from FLOPs and bytes]):")
    print(memfit.plan.cost.cost_table(rows))
    return 0 if measured == expected else 1


if __name__ == "__main__":
    sys.exit(main())
