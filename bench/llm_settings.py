"""Does an 8B Llama fine-tune fit a 24 GiB card, and with what? Each setting
people choose between is applied to the real transformers model built on the
meta device and measured in meta mode (memfit.profile, two iterations,
target_device="cuda"), with its estimated step time from FLOPs and bytes
(memfit.estimate_costs; estimates, not timings).

    PYTHONPATH=build/python .venv/bin/python bench/llm_settings.py [--quick]
        [--budget 24GiB --tokens 4096]

Default shape: Llama-3-8B (32 layers, hidden 4096, intermediate 14336, 32
heads, 8 key/value heads, vocab 128256). --quick: 2 layers, hidden 512,
vocab 8000, 512 tokens. Rows: fp32 AdamW; bf16 weights with bf16 AdamW;
SGD; Adafactor; gradient checkpointing (HF gradient_checkpointing_enable()); LoRA
(peft, q_proj/v_proj, rank 8/16/64) on bf16 weights, with and without
checkpointing; micro-batches with gradient accumulation (the step measured
at the micro-batch: accumulated gradients are the same tensors).

Not rows: autocast (torch.autocast has no meta dispatch: under it a meta
step stays fp32, the fp32 row), 8-bit Adam (bitsandbytes needs CUDA)."""

import argparse
import json
import sys
import time

import torch

import memfit
from memfit.step_cost import count_step_flops


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget", default="24GiB")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=4, help="samples per optimizer step")
    a = ap.parse_args(argv)
    try:
        import transformers
    except ImportError:
        print("[llm_settings] transformers does not import: pip install transformers")
        return 0
    try:
        import peft
    except ImportError:
        peft = None
    if a.quick:
        shape = dict(num_hidden_layers=2, hidden_size=512, intermediate_size=1792,
                     num_attention_heads=8, num_key_value_heads=2, vocab_size=8000)
        a.tokens = 512
    else:
        shape = dict(num_hidden_layers=32, hidden_size=4096, intermediate_size=14336,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)
    cfg = transformers.LlamaConfig(**shape, max_position_embeddings=a.tokens, use_cache=False)
    budget = memfit.parse_size(a.budget)

    def build(dtype=torch.float32, checkpointing=False, lora=None):
        with torch.device("meta"):
            m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        m.train()
        if checkpointing:
            m.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora:
            m = peft.get_peft_model(m, peft.LoraConfig(r=lora,
                                                       target_modules=["q_proj", "v_proj"]))
        return m

    def adamw(m):
        return torch.optim.AdamW([p for p in m.parameters() if p.requires_grad])

    def sgd(m):
        return torch.optim.SGD(m.parameters(), lr=1e-3)

    rows = [
        ("fp32 weights, AdamW", dict(), adamw, 1),
        ("bf16 weights, bf16 AdamW state", dict(dtype=torch.bfloat16), adamw, 1),
        ("bf16 weights, SGD (no state)", dict(dtype=torch.bfloat16), sgd, 1),
        ("bf16 weights, Adafactor (factored state)", dict(dtype=torch.bfloat16),
         lambda m: torch.optim.Adafactor(m.parameters()), 1),
        ("bf16, AdamW, gradient checkpointing", dict(dtype=torch.bfloat16, checkpointing=True),
         adamw, 1),
    ]
    if peft is not None:
        for r in (8, 16, 64):
            rows.append((f"bf16, LoRA r={r} (q_proj, v_proj), AdamW",
                         dict(dtype=torch.bfloat16, lora=r), adamw, 1))
        rows.append(("bf16, LoRA r=16, gradient checkpointing",
                     dict(dtype=torch.bfloat16, lora=16, checkpointing=True), adamw, 1))
    rows.append((f"bf16, AdamW, checkpointing, micro-batch 1 x {a.batch} accumulated",
                 dict(dtype=torch.bfloat16, checkpointing=True), adamw, a.batch))
    if peft is not None:
        rows.append((f"bf16, LoRA r=16, checkpointing, micro-batch 1 x {a.batch} accumulated",
                     dict(dtype=torch.bfloat16, lora=16, checkpointing=True), adamw, a.batch))

    print(f"torch {torch.__version__}, transformers {transformers.__version__}"
          f"{', peft ' + peft.__version__ if peft else ' (peft does not import: no LoRA rows)'}; "
          f"LlamaForCausalLM {shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, "
          f"vocab {shape['vocab_size']}; {a.batch} x {a.tokens} tokens per step; budget "
          f"{memfit.format_bytes(budget)}; meta mode, unverified")
    print("| setting | trainable | peak (allocated) | CUDA reserved | fits | est. step time | "
          "profile s |")
    print("|---|---|---|---|---|---|---|")
    base_flops = None
    for name, kw, opt, accumulate in rows:
        model = build(**kw)
        micro = a.batch // accumulate
        ids = torch.zeros(micro, a.tokens, dtype=torch.long, device="meta")
        x = {"input_ids": ids, "labels": ids}
        t0 = time.perf_counter()
        try:
            r = memfit.profile(model, x, loss_fn=lambda out: out.loss, optimizer=opt(model),
                               mode="meta", target_device="cuda")
        except (ValueError, RuntimeError) as e:
            print(f"| {name} | | {str(e).splitlines()[0][:120]} | | | | |")
            continue
        seconds = time.perf_counter() - t0
        reserved = json.loads(r.to_json(pretty=False))["cuda"]["peak_reserved_bytes"]
        flops = count_step_flops(model, x, loss_fn=lambda out: out.loss)
        total = (flops.forward + flops.backward) * accumulate
        base_flops = base_flops or total
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        print(f"| {name} | {trainable / 1e6:,.1f} M | {memfit.format_bytes(r.peak_bytes)} | "
              f"{memfit.format_bytes(reserved)} | {'yes' if reserved <= budget else 'no'} | {total / base_flops:.2f}x (FLOPs) | "
              f"{seconds:.1f} |")
    print("(est. step time: FLOPs counted on meta relative to the first row, an estimate; "
          "Note [Time estimated from FLOPs and bytes])")
    return 0


if __name__ == "__main__":
    sys.exit(main())
