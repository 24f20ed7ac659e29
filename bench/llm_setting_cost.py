"""Where an LLM advise's time goes, setting by setting:
for each setting `memfit.advise(settings="auto")` proposes for a Llama on
meta, the time of its three parts, each run alone: making the changed copy
(`materialize`), recording its step (`memfit.profile` on meta, run
twice: the second is warm) and recording it again while counting its
FLOPs for the time estimates, as advise does (See Note [FLOPs counted
while a step is recorded]); beside them, counting the FLOPs alone by
running the step again (`count_step_flops`, what advise did before). The
plain model's come first, for scale.

    PYTHONPATH=build/python .venv/bin/python bench/llm_setting_cost.py [--quick]
        [--size 8B --tokens 4096 --batch 4]

--quick: 2 layers, hidden 512, vocab 8000, 512 tokens, a budget of 128 MiB.

Seconds on this machine, one run each: compare rows within one run.
"""

import argparse
import os
import sys
import time

import torch

import memfit
from memfit._step.step_flops import counting_flops
from memfit.plan.cost import count_step_flops
from memfit.plan.strategies.checkpoint import find_chain
from memfit.plan.strategies.llm_settings import llm_settings, materialize, user_optimizer_on

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_settings import QUICK_SHAPE, SHAPES  # noqa: E402


def seconds(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--size", choices=sorted(SHAPES), default="8B")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--budget", default="24GiB", help="what the settings are proposed for")
    a = ap.parse_args(argv)
    try:
        import transformers
    except ImportError:
        print("[llm_setting_cost] transformers does not import: pip install transformers")
        return 0
    shape = SHAPES[a.size]
    if a.quick:
        shape = QUICK_SHAPE
        a.tokens, a.budget, a.size = 512, "128MiB", "(2 layers x 512)"
    cfg = transformers.LlamaConfig(**shape, max_position_embeddings=a.tokens, use_cache=False)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    model.train()
    ids = torch.zeros(a.batch, a.tokens, dtype=torch.long, device="meta")
    x = {"input_ids": ids, "labels": ids}

    def loss(out):
        return out.loss

    user = torch.optim.AdamW(model.parameters())
    print(f"torch {torch.__version__}, transformers {transformers.__version__}; Llama {a.size} "
          f"on meta, {a.batch} x {a.tokens} tokens, AdamW")
    print(f"{'setting':<90} {'copy':>6} {'record':>7} {'again':>6} {'+FLOPs':>7} "
          f"{'FLOPs alone':>11}")

    def parts(m, opt):
        paths = list(find_chain(m).block_paths)

        def counted():
            with counting_flops(paths):
                memfit.profile(m, x, loss_fn=loss, optimizer=opt, mode="meta")

        return (seconds(lambda: memfit.profile(m, x, loss_fn=loss, optimizer=opt, mode="meta")),
                seconds(lambda: memfit.profile(m, x, loss_fn=loss, optimizer=opt, mode="meta")),
                seconds(counted), seconds(lambda: count_step_flops(m, x, loss_fn=loss)))

    first, again, counted, alone = parts(model, user)
    print(f"{'(the plain model)':<90} {'-':>6} {first:7.2f} {again:6.2f} {counted:7.2f} "
          f"{alone:11.2f}")
    settings, _ = llm_settings(model, memfit.parse_size(a.budget))
    totals = [0.0] * 5
    for st in settings:
        made = []
        copy = seconds(lambda: made.append(materialize(model, st)))
        m = made[0][0]
        opt = st.optimizer(m, user) if st.optimizer else user_optimizer_on(m, user)
        first, again, counted, alone = parts(m, opt)
        for i, t in enumerate((copy, first, again, counted, alone)):
            totals[i] += t
        print(f"{st.label:<90} {copy:6.2f} {first:7.2f} {again:6.2f} {counted:7.2f} "
              f"{alone:11.2f}")
    print(f"{'(the settings, in all)':<90} {totals[0]:6.2f} {totals[1]:7.2f} {totals[2]:6.2f} "
          f"{totals[3]:7.2f} {totals[4]:11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
