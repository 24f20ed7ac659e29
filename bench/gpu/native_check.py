"""find_batch_size on the card against the card's own truth, and against
Lightning's BatchSizeFinder, for each case below:

- memfit: find_batch_size with the model on the card, called as a user
  would (budget given); its cost in steps (probes and the verifying step,
  two iterations each, wherever memfit ran them: fit.mode) and wall seconds;
  then its answer run capped at the budget (the verdict: no OOM);
- truth: the largest batch whose plain Adam steps (no memfit) run with the
  caching allocator capped at the budget
  (torch.cuda.set_per_process_memory_fraction), by bisection around
  memfit's answer; peak stats reset and the cache emptied between trials;
- lightning: BatchSizeFinder(mode="binsearch") under the same cap, if
  lightning imports; else the row says it was skipped;
- truth.runs_above (native.json only): batches above the truth (10% and
  20%, and memfit's or Lightning's answer if above) run capped: whether the
  card's memory grows with the batch there, as the bisection assumes;
- uncapped (native.json only): the card's peak reserved and allocated
  bytes of plain steps at memfit's answer and at the truth on the whole
  card: how far the unbounded reserve (what memfit's search held to the
  budget before it ran capped, Note [A card capped at the budget]) is
  from what a capped card needs.

    PYTHONPATH=build-gpu/python python bench/gpu/native_check.py [--out DIR]
        [--only CASE,...] [--skip-lightning] [--dry-run]

--dry-run (or no GPU): lists the cases and what would run; imports neither
memfit nor the optional packages. Writes native.json and native.md to
--out (default $OUT, else build-gpu/native).
"""

import argparse
import gc
import importlib.util
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
# memfit's model twins by file, not through `import memfit`: the dry run needs
# torch alone (as record_snapshots.py).
_spec = importlib.util.spec_from_file_location(
    "memfit_testing_models", os.path.join(HERE, "..", "..", "python", "memfit", "testing", "models.py"))
models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(models)

# The cases, apart: listing them needs no torch (gpu_check.sh --native --dry-run).
_spec = importlib.util.spec_from_file_location("native_cases", os.path.join(HERE, "native_cases.py"))
native_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(native_cases)
CASES, MiB = native_cases.CASES, native_cases.MiB
STEPS = 2  # plain steps per trial, as memfit's probes and Lightning's trials


def _hf_lm(kind):
    import transformers as tf

    if kind == "gpt2":
        config = tf.GPT2Config(vocab_size=8192, n_positions=256, n_embd=256, n_layer=4, n_head=4)
        model = tf.GPT2LMHeadModel(config)
    else:
        config = tf.LlamaConfig(vocab_size=8192, hidden_size=256, intermediate_size=512,
                                num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, max_position_embeddings=256)
        model = tf.LlamaForCausalLM(config)
    vocab = config.vocab_size

    def batch(b):
        ids = torch.randint(0, vocab, (b, 129))
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def loss(out, y):
        return F.cross_entropy(out.logits.flatten(0, 1), y.flatten())

    return model, batch, loss


def build(case):
    """(model, make_batch(b) -> (x, y), loss_fn(out, y)), on the CPU."""
    torch.manual_seed(0)
    kind = case.name.split("_")[0]
    if kind == "hf":
        return _hf_lm(case.name.split("_")[1])
    if kind == "compiled":
        model = torch.compile(models.Pointwise(d=256, n=6))
        return model, lambda b: (torch.randn(b, 64, 256), torch.randint(0, 10, (b,))), F.cross_entropy
    name = kind if kind != "resnet18" or models.available("resnet18") else "resnet18-twin"
    make_model, make_batch, loss_fn = models.MODELS[name]
    return make_model(), make_batch, lambda o, t: models.loss_of(o, t, loss_fn)


# --- on the card ----------------------------------------------------------------


def clean():
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def plain_steps(model, make_batch, loss_fn, b):
    """STEPS plain Adam steps at batch b on the card; False on an OOM."""
    try:
        x, y = (t.cuda() for t in make_batch(b))
        opt = torch.optim.Adam(model.parameters())
        for _ in range(STEPS):
            loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        model.zero_grad(set_to_none=True)
        x = y = opt = None  # noqa: F841  (drop the trial's tensors before clean())


def true_max(model, make_batch, loss_fn, start):
    """The largest batch whose plain steps run under the cap, searched from
    `start` (memfit.testing.truth.largest_that_fits, the search the CPU
    truth uses). Returns (batch, trials, whether `start` ran)."""
    from memfit.testing.truth import largest_that_fits

    ran = {}

    def runs(b):
        ran[b] = plain_steps(model, make_batch, loss_fn, b)
        clean()
        return ran[b]

    start = max(1, start)
    batch = largest_that_fits(runs, start)
    return batch, len(ran), ran[start]


def runs_above(model, make_batch, loss_fn, truth, others):
    """Which batches above the bisected truth still run capped (10% and
    20% above it, and any other answer above it): the bisection assumes
    memory grows with the batch, and a card's kernels can change with it
    (Lightning's Llama trial ran 48 where the truth stopped at 40)."""
    above = {}
    for b in sorted({int(truth * 1.1) + 1, int(truth * 1.2) + 1, *[o for o in others if o]}):
        if b > truth:
            above[str(b)] = plain_steps(model, make_batch, loss_fn, b)
            clean()
    return above


def memfit_fit(model, make_batch, loss_fn, budget):
    import memfit

    x, y = (t.cuda() for t in make_batch(8))
    t0 = time.perf_counter()
    # The truth's loop (plain_steps) and Lightning's training_step drop the
    # output once the loss exists: keep_output=False fits that loop.
    fit = memfit.find_batch_size(model, x, y, loss_fn=loss_fn, optimizer="adam", budget=budget,
                                 keep_output=False)
    wall = time.perf_counter() - t0
    # memfit caps the card at the budget while it searches and must put the
    # user's fraction (here the default, 1.0) back.
    get = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    fraction = get() if get else None
    return dict(batch=fit.max_batch, steps=2 * len(fit.probes), where=fit.mode,
                verified=fit.verified, wall_s=round(wall, 2), fraction_after=fraction,
                probes=[(p.batch, p.peak_bytes, p.out_of_memory) for p in fit.probes],
                notes=list(fit.notes))  # a compiled model's recompiles and their reasons


def lightning_fit(model, make_batch, loss_fn):
    try:
        import lightning as L
        from lightning.pytorch.callbacks import BatchSizeFinder
    except ImportError:
        return dict(skipped="lightning does not import")
    x1, y1 = make_batch(1)
    steps = 0

    class Samples(torch.utils.data.Dataset):
        def __len__(self):
            return 1 << 24

        def __getitem__(self, i):
            return x1[0], y1[0]

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net, self.batch_size = model, 2

        def training_step(self, batch, _):
            nonlocal steps
            steps += 1
            return loss_fn(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters())

        def train_dataloader(self):
            return torch.utils.data.DataLoader(Samples(), batch_size=self.batch_size)

    finder = BatchSizeFinder(mode="binsearch", steps_per_trial=STEPS, max_trials=40)
    trainer = L.Trainer(accelerator="cuda", devices=1, max_steps=1, callbacks=[finder],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    t0 = time.perf_counter()
    trainer.fit(Module())
    wall = time.perf_counter() - t0
    # steps: the finder's trials, less the one step fit() runs after it.
    return dict(batch=finder.optimal_batch_size, steps=steps - 1, wall_s=round(wall, 2))


def attempt(what, *args):
    """what(*args), or dict(error=...): one part failing leaves the others' figures."""
    try:
        return what(*args)
    except Exception as e:  # noqa: BLE001 (a card session is short: report and go on)
        return dict(error=f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")


def run_case(case, lightning=True):
    model, make_batch, loss_fn = build(case)
    model = model.cuda()
    clean()
    row = dict(case=case.name, budget=case.budget,
               memfit=attempt(memfit_fit, model, make_batch, loss_fn, case.budget))
    clean()
    torch.cuda.set_per_process_memory_fraction(case.budget / torch.cuda.mem_get_info()[1])
    try:
        found = row["memfit"].get("batch")
        t0 = time.perf_counter()
        batch, trials, ran = true_max(model, make_batch, loss_fn, found or 64)
        row["truth"] = dict(batch=batch, steps=STEPS * trials,
                            wall_s=round(time.perf_counter() - t0, 2))
        row["answer_ran_capped"] = ran if found else None
        row["found_over_true"] = round(found / max(1, batch), 4) if found else None
        row["lightning"] = (attempt(lightning_fit, model, make_batch, loss_fn) if lightning
                            else dict(skipped="--skip-lightning"))
        row["truth"]["runs_above"] = runs_above(model, make_batch, loss_fn, batch,
                                                [found, row["lightning"].get("batch")])
        torch.cuda.set_per_process_memory_fraction(1.0)
        row["uncapped"] = {str(b): uncapped_peaks(model, make_batch, loss_fn, b)
                           for b in {found, batch} if b}
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        del model
        clean()
    return row


def uncapped_peaks(model, make_batch, loss_fn, b):
    """The card's peaks over plain steps at batch b with no cap: what memfit
    holds against the budget (reserved, unbounded) beside what a capped card
    needs. At the true maximum, reserved/budget above 1 means holding the
    unbounded reserve to the budget stops short of the capped truth (the
    budget criterion the next card session decides)."""
    clean()
    ran = plain_steps(model, make_batch, loss_fn, b)
    peaks = dict(ran=ran, reserved=torch.cuda.max_memory_reserved(),
                 allocated=torch.cuda.max_memory_allocated())
    clean()
    return peaks


def _cells(part, keys):
    if "error" in part or "skipped" in part:
        return " | ".join([part.get("error") or "skipped: " + part["skipped"]] +
                          ["-"] * (len(keys) - 1))
    return " | ".join(str(part[k]) for k in keys)


def markdown(rows, title):
    out = [f"# {title}", "",
           "| case | budget MiB | memfit batch | memfit steps | where | memfit s | true max | "
           "truth steps | found/true | answer capped | Lightning batch | Lightning steps | "
           "Lightning s |",
           "|---|---:|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['case']} | {r['budget'] // MiB} | {r['error']} |" + " - |" * 10)
            continue
        capped = {True: "ran", False: "OOM", None: "-"}[r["answer_ran_capped"]]
        out.append(f"| {r['case']} | {r['budget'] // MiB} | "
                   f"{_cells(r['memfit'], ('batch', 'steps', 'where', 'wall_s'))} | "
                   f"{r['truth']['batch']} | {r['truth']['steps']} | {r['found_over_true']} | "
                   f"{capped} | {_cells(r['lightning'], ('batch', 'steps', 'wall_s'))} |")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join("build-gpu", "native"))
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--skip-lightning", action="store_true",
                    help="memfit and the plain-step truth only (a rerun in a short lease)")
    args = ap.parse_args(argv)
    cases = native_cases.selected(args.only)
    if args.dry_run or not torch.cuda.is_available():
        native_cases.describe(cases, "dry run" if args.dry_run else "no CUDA device", args.out)
        return 0
    os.makedirs(args.out, exist_ok=True)
    title = (f"memfit on the card: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(title, flush=True)
    rows = []
    for c in cases:
        t0 = time.perf_counter()
        try:
            row = run_case(c, lightning=not args.skip_lightning)
        except Exception as e:  # a case that cannot run here (a missing package) says why
            row = dict(case=c.name, budget=c.budget, error=f"{type(e).__name__}: {str(e)[:160]}")
        row["case_wall_s"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(os.path.join(args.out, "native.json"), "w") as f:
            json.dump(dict(title=title, rows=rows), f, indent=1)
        with open(os.path.join(args.out, "native.md"), "w") as f:
            f.write(markdown(rows, title))
    print(markdown(rows, title))
    bad = [r["case"] for r in rows if r.get("answer_ran_capped") is False]
    print(f"answers that ran out of memory capped at the budget: {len(bad)} of {len(rows)} {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
