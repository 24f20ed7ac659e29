"""Does an 8B Llama fine-tune fit a 24 GiB card at 4096 tokens, and with
what? One call: memfit.advise on the transformers model built on the meta
device (no weights, no GPU), with the budget and allow_approximate=True.
Its rows are the settings people choose between (HF gradient
checkpointing, bf16 weights, Adafactor, SGD, LoRA r=64/16/8 on q_proj and
v_proj via peft), memfit's checkpointing and the optimizer rows, each
recorded in meta mode; its plan adds memfit's checkpointing of every block
and micro-batches with gradient accumulation where a setting alone does
not fit. Times are estimates from FLOPs counted on meta (~).

    PYTHONPATH=build/python .venv/bin/python bench/llm_settings.py [--quick]
        [--budget 24GiB --tokens 4096 --batch 4]

Default shape: Llama-3-8B (32 layers, hidden 4096, intermediate 14336, 32
heads, 8 key/value heads, vocab 128256), fp32 weights as from_config makes
them, AdamW. --quick: 2 layers, hidden 512, vocab 8000, 512 tokens, a
budget of 128 MiB: seconds.

New rows (#33): the chunked loss (exact), bf16 weights with torchao's 8-bit
AdamW, QLoRA r=16 (torchao NF4 on every projection) alone and with the
chunked loss; --cards: the plan of each card from the same recordings.
Not rows: autocast (torch.autocast has no meta dispatch), paged AdamW
(CUDA unified memory). The budget is a card's: advise records each
step for a CUDA target and holds the budget against the caching
allocator's reserved bytes (--target cpu: allocated bytes, as before). The
last line profiles the plan's step again for a CUDA target, a check of
the plan's peak."""

import argparse
import sys
import time

import torch

import memfit
from memfit.plan.strategies import checkpointed
from memfit.plan.strategies.llm_settings import materialize, user_optimizer_on


SHAPES = {
    "1B": dict(num_hidden_layers=16, hidden_size=2048, intermediate_size=8192,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256),
    "3B": dict(num_hidden_layers=28, hidden_size=3072, intermediate_size=8192,
               num_attention_heads=24, num_key_value_heads=8, vocab_size=128256),
    "8B": dict(num_hidden_layers=32, hidden_size=4096, intermediate_size=14336,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256),
}


# --quick: seconds on two cores.
QUICK_SHAPE = dict(num_hidden_layers=2, hidden_size=512, intermediate_size=1792,
                   num_attention_heads=8, num_key_value_heads=2, vocab_size=8000)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget", default=None, help="default 24GiB (--quick: 128MiB)")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=4, help="samples per optimizer step")
    ap.add_argument("--progress", action="store_true", help="a line per recording on stderr")
    ap.add_argument("--size", choices=sorted(SHAPES), default="8B",
                    help="the Llama-3 shape (1B, 3B: Llama-3.2's; 8B: Llama-3-8B)")
    ap.add_argument("--cards", default="8GiB,12GiB,16GiB,24GiB,40GiB,80GiB",
                    help="the plan of each card too ('' for none)")
    ap.add_argument("--target", choices=("cuda", "cpu"), default="cuda",
                    help="the device the budget is for (cuda: reserved bytes)")
    a = ap.parse_args(argv)
    try:
        import transformers
    except ImportError:
        print("[llm_settings] transformers does not import: pip install transformers")
        return 0
    if a.quick:
        shape = QUICK_SHAPE
        a.tokens = 512
        a.budget = a.budget or "128MiB"
    else:
        shape = SHAPES[a.size]
        a.budget = a.budget or "24GiB"
    cfg = transformers.LlamaConfig(**shape, max_position_embeddings=a.tokens, use_cache=False)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    model.train()
    ids = torch.zeros(a.batch, a.tokens, dtype=torch.long, device="meta")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}; "
          f"LlamaForCausalLM {shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, "
          f"vocab {shape['vocab_size']}, on meta; {a.batch} x {a.tokens} tokens per step; "
          f"AdamW; budget {a.budget}")
    t0 = time.perf_counter()
    try:
        advice = memfit.advise(
            model, {"input_ids": ids, "labels": ids}, loss_fn=lambda out: out.loss,
            optimizer=torch.optim.AdamW(model.parameters()), budget=a.budget, mode="meta",
            allow_approximate=True, progress=True if a.progress else None,
            target_device=a.target, cards=[c for c in a.cards.split(",") if c] or None)
    except memfit.DoesNotFit as e:
        advice = e.advice
        print(str(e))
    seconds = time.perf_counter() - t0
    print(advice.table())
    print(f"(memfit.advise took {seconds:.1f} s)")
    if advice.plan.found and advice.plan.strategy.setting:
        print(reserved_line(advice, model, ids))
    return 0


def reserved_line(advice, model, ids):
    """The plan's step profiled again for a CUDA target: what the caching
    allocator would reserve, beside the allocated peak advise compares."""
    p = advice.plan
    st = advice.setting(p.strategy.setting)
    m, prefix = materialize(model, st)
    paths = [f"{prefix}.{q}" if prefix else q for q in advice.chain.block_paths]
    mb = p.micro_batch or len(ids)
    x = {"input_ids": ids[:mb], "labels": ids[:mb]}
    user = torch.optim.AdamW(model.parameters())
    opt = st.optimizer(m, user) if st.optimizer else user_optimizer_on(m, user)
    with checkpointed([m.get_submodule(paths[i]) for i in p.strategy.checkpoint]):
        r = memfit.profile(m, x, loss_fn=lambda out: out.loss, optimizer=opt, mode="meta",
                           target_device="cuda", set_to_none=not p.strategy.zero_grad_in_place)
    reserved = r.cuda.peak_reserved
    fb = memfit.format_bytes
    return (f"the plan's step profiled for a CUDA target (target_device='cuda', its optimizer "
            f"as torch runs it there): "
            f"{fb(r.peak_bytes)} allocated, {fb(reserved)} reserved by the caching allocator")


if __name__ == "__main__":
    sys.exit(main())
