"""memfit's callbacks against the frameworks' own batch finders, inside the
frameworks' own training loops, on memfit's simulated device (a CPU memory
budget whose OOM reads "CUDA out of memory.", so each framework's own OOM
detector fires).

Lightning  3 models of bench/_peer_models.py (mlp, cnn, gpt), each in a
           LightningModule whose train_dataloader reads self.batch_size
           (Adam; CPU accelerator; no logger, checkpoint or progress bar):
           - Lightning's BatchSizeFinder callback, mode "power" and
             "binsearch", its defaults (init_val 2, steps_per_trial 3,
             max_trials 25, margin 0.05, max_val 8192);
           - memfit.integrations.lightning.FitBatchSize();
           - the effective batch: the module asks for N samples a step
             (batch_size N, which does not fit): FitBatchSize(
             keep_effective_batch=N) against BatchSizeFinder (binsearch),
             which changes the batch and leaves accumulate_grad_batches at 1.
           Each finder runs at on_fit_start of a fit with max_steps=20; the
           fit then trains 20 steps at what it found ("20 steps": all 20
           ran, no OOM).
Hugging Face  a GPT2LMHeadModel from a small config in the HF Trainer, the
           user's effective batch E = per_device_train_batch_size E x
           gradient_accumulation_steps 1 (does not fit):
           - auto_find_batch_size=True (accelerate's
             find_executable_batch_size: x0.9 on each OOM, accumulation
             left as it was);
           - memfit.integrations.transformers.FitBatchSize() (per-device
             batch x accumulation kept at E).
           train() with max_steps=20.

The true maximum is the largest batch the framework's own loop survives for
20 steps (found by bisection on 3-step runs, then checked at 20 steps: T
survives, T+1 does not); where the effective batch is kept, the largest
divisor d of N whose loop (batch d, accumulation N/d) survives 20 steps.
Columns: found / true maximum; OOMs hit (each framework's OOM detector
counted, plus any OOM that ended the fit); full-size steps spent finding
(the finder's trial steps; memfit's: its verifying whole steps, BatchFit
trials); the wall time of the finding alone; whether 20 steps ran; whether
batch x accumulation is the effective batch asked for. Goals: 0 above the
true maximum, found/true >= 0.98, <= 2 full-size steps, the effective batch
exact.

    PYTHONPATH=build/python .venv/bin/python bench/frameworks.py [--quick]
        [--json PATH] [--threads 1] [--sections lightning,hf]

--quick runs the mlp only in Lightning. The bench exits 0 when it completes;
a method that raises is a result (its first line is reported).
"""

import argparse
import contextlib
import gc
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import memfit  # noqa: E402

import _peer_models as pm  # noqa: E402
from peers.common import quiet_loggers  # noqa: E402

LIGHTNING_CASES = [("mlp", "15MiB", 2048), ("cnn", "24MiB", 1024), ("gpt", "32MiB", 1024)]
HF_CASE = dict(budget="12MiB", effective=192, seq=32, vocab=512, layers=2, width=64)
STEPS = 20
PROBE_STEPS = 3


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def first_line(e):
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {line.split(' (memfit simulated')[0][:160]}"


def quiet():
    return quiet_loggers("lightning", "lightning.pytorch", "lightning.fabric",
                         "pytorch_lightning", "transformers", "accelerate")


def clean():
    gc.collect()


def true_max(survives, start=2, limit=1 << 15):
    """The largest b with survives(b, STEPS): doubling and bisection on
    PROBE_STEPS-step runs, then T checked at STEPS steps (down while it
    fails) and T+1 (up while it survives)."""
    low, size, high = 0, start, None
    while high is None:
        if survives(size, PROBE_STEPS):
            low, size = size, size * 2
            if size > limit:
                return None
        else:
            high = size
    while high - low > 1:
        mid = (low + high) // 2
        if survives(mid, PROBE_STEPS):
            low = mid
        else:
            high = mid
    t = low
    while t > 0 and not survives(t, STEPS):
        t -= 1
    while survives(t + 1, STEPS):
        t += 1
    return t


def true_divisor_max(n, survives, below):
    """The largest divisor d <= below of n whose loop at (d, n // d)
    survives STEPS steps."""
    for d in sorted((d for d in range(1, min(n, below) + 1) if n % d == 0), reverse=True):
        if survives(d, STEPS, n // d):
            return d
    return 0


# =============================================================================
# Lightning
# =============================================================================

def lightning_classes():
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self, spec, batch_size):
            super().__init__()
            self.spec = spec
            self.net = spec.model()
            self.batch_size = batch_size
            self.calls = 0

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.calls += 1
            return self.spec.loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(pm.PoolDataset(self.spec, length=1 << 17),
                                               batch_size=self.batch_size, shuffle=False)

    class Steps(pl.Callback):
        def __init__(self):
            self.sizes = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.sizes.append(batch[0].shape[0])

    return pl, Module, Steps


def lightning_trainer(pl, tmp, callbacks, **kw):
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, max_epochs=1000,
                      default_root_dir=tmp, callbacks=callbacks, **kw)


def lightning_survives(spec, budget, tmp):
    pl, Module, Steps = lightning_classes()
    cache = {}

    def survives(b, steps, accumulate=1):
        key = (b, steps, accumulate)
        if key not in cache:
            clean()
            steps_cb = Steps()
            with quiet(), memfit.simulated_device(budget):
                try:
                    lightning_trainer(pl, tmp, [steps_cb], max_steps=steps,
                                      accumulate_grad_batches=accumulate).fit(Module(spec, b))
                    cache[key] = len(steps_cb.sizes) >= steps * accumulate
                except torch.OutOfMemoryError:
                    cache[key] = False
            clean()
        return cache[key]

    survives.cache = cache
    return survives


def lightning_method(spec, budget, tmp, method, effective=None):
    """One finder inside Lightning's fit (max_steps=STEPS): what it found,
    its OOMs, trial steps, time, and whether the 20 steps ran."""
    import lightning.pytorch.tuner.batch_size_scaling as bss
    from lightning.pytorch.callbacks import BatchSizeFinder

    from memfit.integrations.lightning import FitBatchSize

    pl, Module, Steps = lightning_classes()
    clean()
    ooms = []
    original = bss.is_oom_error

    def counting(e):
        r = original(e)
        if r:
            ooms.append(first_line(e))
        return r

    row = dict(method=method, model=spec.name, budget=budget, effective=effective)
    if method.startswith("memfit"):
        finder = FitBatchSize(keep_effective_batch=effective)
    else:
        finder = BatchSizeFinder(mode="power" if "power" in method else "binsearch")
    timed = finder.on_fit_start
    spent = {}

    def on_fit_start(trainer, module):
        t0 = time.perf_counter()
        try:
            return timed(trainer, module)
        finally:
            spent["seconds"] = time.perf_counter() - t0
            spent["calls"] = module.calls

    finder.on_fit_start = on_fit_start
    steps_cb = Steps()
    bss.is_oom_error = counting
    try:
        with quiet(), memfit.simulated_device(budget):
            module = Module(spec, effective or 2)
            trainer = lightning_trainer(pl, tmp, [finder, steps_cb], max_steps=STEPS)
            try:
                trainer.fit(module)
            except Exception as e:  # noqa: BLE001 (a finder raising is a result)
                row["error"] = first_line(e)
                if isinstance(e, torch.OutOfMemoryError):
                    ooms.append(first_line(e))
            row["batch"] = module.batch_size
            row["accumulate"] = trainer.accumulate_grad_batches
            row["steps_run"] = len(steps_cb.sizes) // max(1, trainer.accumulate_grad_batches)
            module = trainer = None
    finally:
        bss.is_oom_error = original
    row["ooms"] = len(ooms)
    row["seconds"] = spent.get("seconds")
    if method.startswith("memfit"):
        plan = finder.plan
        row["full_steps"] = plan.full_size_steps if plan else None
    else:
        row["full_steps"] = spent.get("calls")  # every training step its trials ran
    row["survived"] = row["steps_run"] >= STEPS and "error" not in row
    row["effective_kept"] = (None if effective is None
                             else row["batch"] * row["accumulate"] == effective)
    clean()
    return row


def run_lightning(cases, tmp):
    rows = []
    for name, budget, effective in cases:
        spec = pm.fit_specs()[name]
        spec.pool()  # the host's data set, made outside any budget
        survives = lightning_survives(spec, budget, tmp)
        log(f"lightning {name} {budget}: true maximum")
        t = true_max(survives)
        log(f"  {t}; the methods")
        for method in ("Lightning power", "Lightning binsearch", "memfit FitBatchSize"):
            r = lightning_method(spec, budget, tmp, method)
            r["true_max"] = t
            rows.append(r)
            log(f"  {method}: {r.get('batch')} ({r.get('seconds') or 0:.1f} s)")
        log(f"  effective batch {effective}: true maximum among its divisors")
        td = true_divisor_max(effective, survives, t)
        for method in ("Lightning binsearch", "memfit FitBatchSize"):
            r = lightning_method(spec, budget, tmp, method + " (keep)",
                                 effective=effective)
            r["true_max"] = td if method.startswith("memfit") else t
            rows.append(r)
            log(f"  {method} keeping {effective}: {r.get('batch')} x {r.get('accumulate')}")
    return rows


# =============================================================================
# Hugging Face
# =============================================================================

def hf_parts(case):
    import transformers

    transformers.logging.set_verbosity_error()
    seq, vocab = case["seq"], case["vocab"]
    pool = torch.randint(0, vocab, (256, seq), generator=torch.Generator().manual_seed(0))

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 1 << 16

        def __getitem__(self, i):
            ids = pool[i % len(pool)]
            return {"input_ids": ids, "labels": ids}

    def model():
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=case["layers"], n_embd=case["width"], n_head=4, vocab_size=vocab,
            n_positions=seq, attn_implementation="eager", bos_token_id=0, eos_token_id=1))

    class Counting(transformers.Trainer):
        def training_step(self, model, inputs, *args, **kwargs):
            self.sizes = getattr(self, "sizes", []) + [inputs["input_ids"].shape[0]]
            return super().training_step(model, inputs, *args, **kwargs)

    def arguments(tmp, per_device, accumulation, auto=False):
        return transformers.TrainingArguments(
            output_dir=tmp, use_cpu=True, report_to=[], save_strategy="no",
            logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
            per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation,
            max_steps=STEPS, auto_find_batch_size=auto)

    return transformers, Tokens, model, Counting, arguments


def hf_survives(case, tmp):
    transformers, Tokens, model, Counting, arguments = hf_parts(case)
    cache = {}

    def survives(b, steps, accumulation=1):
        key = (b, steps, accumulation)
        if key not in cache:
            clean()
            with quiet(), memfit.simulated_device(case["budget"]):
                args = arguments(tmp, b, accumulation)
                args.max_steps = steps
                trainer = Counting(model=model(), args=args, train_dataset=Tokens())
                try:
                    with contextlib.redirect_stdout(sys.stderr):  # train()'s metrics dict
                        trainer.train()
                    cache[key] = trainer.state.global_step >= steps
                except torch.OutOfMemoryError:
                    cache[key] = False
                trainer = None
            clean()
        return cache[key]

    return survives


def hf_method(case, tmp, method):
    import accelerate.utils.memory as acc_memory

    from memfit.integrations.transformers import FitBatchSize

    transformers, Tokens, model, Counting, arguments = hf_parts(case)
    E = case["effective"]
    row = dict(method=method, model="hf-gpt2", budget=case["budget"], effective=E)
    ooms = []
    original = acc_memory.should_reduce_batch_size

    def counting(e):
        r = original(e)
        if r:
            ooms.append(first_line(e))
        return r

    starts = []

    class Starts(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            starts.append((time.perf_counter(), len(getattr(trainer, "sizes", []))))

    clean()
    acc_memory.should_reduce_batch_size = counting
    try:
        with quiet(), memfit.simulated_device(case["budget"]):
            auto = method.startswith("HF")
            args = arguments(tmp, E, 1, auto=auto)
            callbacks = [Starts()]
            fit = None
            if not auto:
                fit = FitBatchSize()
                callbacks.insert(0, fit)
            spent = {}
            if fit is not None:
                plan_fn = fit.fit

                def timed_fit(*a, **k):
                    t0 = time.perf_counter()
                    try:
                        return plan_fn(*a, **k)
                    finally:
                        spent["seconds"] = time.perf_counter() - t0

                fit.fit = timed_fit
            trainer = Counting(model=model(), args=args, train_dataset=Tokens(),
                               callbacks=callbacks)
            built = time.perf_counter()
            try:
                with contextlib.redirect_stdout(sys.stderr):  # train()'s metrics dict
                    trainer.train()
            except Exception as e:  # noqa: BLE001 (a finder raising is a result)
                row["error"] = first_line(e)
                if isinstance(e, torch.OutOfMemoryError) and not ooms:
                    ooms.append(first_line(e))
            sizes = getattr(trainer, "sizes", [])
            if auto:
                # The batch the last attempt ran; the trial steps before it.
                last_start, before = starts[-1] if starts else (built, 0)
                row["seconds"] = last_start - built
                row["full_steps"] = before
                row["batch"] = sizes[-1] if sizes else None
            else:
                row["seconds"] = spent.get("seconds")
                row["full_steps"] = fit.plan.full_size_steps if fit.plan else None
                row["batch"] = args.per_device_train_batch_size
            row["accumulate"] = args.gradient_accumulation_steps
            row["steps_run"] = trainer.state.global_step
            trainer = None
    finally:
        acc_memory.should_reduce_batch_size = original
    row["ooms"] = len(ooms)
    row["survived"] = row["steps_run"] >= STEPS and "error" not in row
    row["effective_kept"] = (row["batch"] or 0) * row["accumulate"] == E
    clean()
    return row


def run_hf(case, tmp):
    survives = hf_survives(case, tmp)
    log(f"hf-gpt2 {case['budget']}: true maximum")
    t = true_max(survives)
    log(f"  {t}; among the divisors of {case['effective']}")
    td = true_divisor_max(case["effective"], survives, t)
    log(f"  {td}")
    rows = []
    for method in ("HF auto_find_batch_size", "memfit FitBatchSize"):
        r = hf_method(case, tmp, method)
        r["true_max"] = td if method.startswith("memfit") else t
        r["true_max_any"], r["true_max_divisor"] = t, td
        rows.append(r)
        log(f"  {method}: {r.get('batch')} x {r.get('accumulate')} ({r.get('seconds') or 0:.1f} s)")
    return rows


# =============================================================================

def table(rows):
    head = ["method", "model (budget)", "found", "true max", "found / true", "OOMs hit",
            "full-size steps", "finding (s)", "20 steps", "effective batch kept"]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        b, t = r.get("batch"), r.get("true_max")
        found = "-" if b is None else (f"{b} x {r['accumulate']}" if r.get("accumulate", 1) > 1
                                       else str(b))
        ratio = "-" if not b or not t else f"{b / t:.3f}"
        eff = r.get("effective")
        kept = ("-" if r.get("effective_kept") is None
                else ("yes" if r["effective_kept"] else "no") + f" ({eff})")
        cells = [r["method"], f"{r['model']} ({r['budget']})", found, t, ratio, r["ooms"],
                 r.get("full_steps"), f"{r['seconds']:.1f}" if r.get("seconds") else "-",
                 "yes" if r["survived"] else "no" + (f": {r['error']}" if r.get("error") else ""),
                 kept]
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sections", default="lightning,hf")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    sections = a.sections.split(",")
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if "lightning" in sections:
            rows += run_lightning(LIGHTNING_CASES[:1] if a.quick else LIGHTNING_CASES, tmp)
        if "hf" in sections:
            rows += run_hf(HF_CASE, tmp)
    import lightning
    import transformers

    print(f"torch {torch.__version__}, lightning {lightning.__version__}, transformers "
          f"{transformers.__version__}, {a.threads} thread(s), "
          f"{time.perf_counter() - t0:.0f} s\n")
    print(table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
