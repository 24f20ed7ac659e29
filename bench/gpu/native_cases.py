"""The cases of the native card check (bench/gpu/native_check.py), apart
from it: listing them needs neither torch nor a GPU, so
`scripts/gpu_check.sh --native --dry-run` runs wherever python3 does.

    python3 bench/gpu/native_cases.py [--out DIR] [--only CASE,...]
"""

import argparse
import dataclasses
import os
import sys

MiB = 1 << 20


@dataclasses.dataclass
class Case:
    name: str
    model: str  # what is built, in words
    budget: int  # bytes, the whole card's (weights included)
    needs: str = ""  # an optional package the case imports


CASES = [
    Case("mlp_256MiB", "memfit's Mlp 784-512-512-10 (the one OOM of the last card run)", 256 * MiB),
    Case("cnn_cudnn_1GiB", "memfit's Cnn, cuDNN convolutions", 1024 * MiB),
    Case("gpt_1GiB", "memfit's Gpt, 4 layers, seq 128", 1024 * MiB),
    Case("resnet18_2GiB", "torchvision resnet18 (its twin without torchvision), 64x64", 2048 * MiB),
    Case("hf_gpt2_1GiB", "HF GPT2LMHeadModel from a config: 4 layers, 256 wide, seq 128", 1024 * MiB,
         "transformers"),
    Case("hf_llama_1GiB", "HF LlamaForCausalLM from a config: 2 layers, 256 wide, seq 128",
         1024 * MiB, "transformers"),
    Case("lstm_512MiB", "memfit's Lstm, 2 layers over 32 steps", 512 * MiB),
    # Last: inductor compiles for each new shape, the slowest case on a card.
    Case("compiled_512MiB", "torch.compile(Pointwise(d=256, n=6)), seq 64", 512 * MiB),
]


def selected(only):
    """The cases named in `only` (comma-separated), or all of them."""
    return [c for c in CASES if not only or c.name in only.split(",")]


def describe(cases, why, out):
    """Prints what the check would run: a line per case, each "case NAME ..."."""
    print(f"native card check ({why}): {len(cases)} cases; each runs find_batch_size with the "
          f"model on the card, plain-step bisection capped at the budget, and Lightning's "
          f"BatchSizeFinder (binsearch) if lightning imports; figures to {out}")
    for c in cases:
        needs = f"; needs {c.needs}" if c.needs else ""
        print(f"case {c.name:<16} budget {c.budget // MiB:>5} MiB  {c.model}{needs}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join("build-gpu", "native"))
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--dry-run", action="store_true", help="the only mode: accepted, as for "
                    "native_check.py")
    args = ap.parse_args(argv)
    describe(selected(args.only), "dry run", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
