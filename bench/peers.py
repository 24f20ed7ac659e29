"""memfit side by side with the real peer libraries, in one process.

Four comparisons, every figure measured in the same run:

fit       On memfit's simulated device (a CPU memory budget whose OOM reads
          "CUDA out of memory.", so the peers' own OOM detectors fire), the
          same model and budget for each method:
          - memfit.find_batch_size(..., budget=the device's size): probes at
            small batches, no full-size step; the probes run on the host CPU
            as they would beside a GPU, so they are not charged to the device;
          - Lightning's Tuner.scale_batch_size, mode "power" and "binsearch",
            its defaults (init_val 2, steps_per_trial 3, max_trials 25,
            margin 0.05, max_val 8192), on a LightningModule wrapping the same
            model (CPU accelerator, no logger, no checkpointing, no progress
            bar; train_dataloader reads self.batch_size, the attribute the
            tuner sets);
          - accelerate's @find_executable_batch_size, once with its default
            starting_batch_size 128 and once starting at 8192 (Lightning's
            max_val: a start above any batch here, for a user who does not
            know the answer). The decorated function is the training: a fresh
            model and Adam, a DataLoader at the batch size, 2 steps; the batch
            it returns with is the one it found.
          The true maximum: the largest batch whose plain training (fresh
          model, Adam, forward, loss, backward, step, zero_grad; 2 iterations)
          runs on the device; found by doubling and bisection, then checked by
          a linear scan around the boundary. Each found batch is then run for
          20 plain steps under the same budget ("survives 20"); Lightning's
          batches also for 20 steps of Lightning's own fit loop.
lazy      memfit.lazy vs koila.lazy on koila's README model (Flatten + 3
          Linear, CrossEntropyLoss) and on the layers koila's issues report it
          fails on (nn.MultiheadAttention, nn.LSTM, a reshape). Without a
          budget and under a budget of half the eager step's memory (eager
          runs out there). koila on a machine without CUDA never splits (it
          reads free memory from NVML); the row "koila, sim. GPU" points its
          free-memory query at the simulated device so that it splits as it
          would on a GPU. Gradients are compared with the eager full batch.
explain   memfit.profile vs torch.distributed._tools.mem_tracker.MemTracker
          on the same step (params on the device, per iteration: batch copy,
          forward, loss, backward, Adam step, zero_grad(set_to_none); 2
          iterations, fresh Adam). Peak, categories at the peak, per module,
          against the bytes measured live by torch.profiler's CPU allocator
          events (independent of memfit) and by memfit.track; wall time over
          the plain step.
estimate  The peak at a large batch predicted by memfit (probes at batches
          4, 8, 16; and meta mode at the batch itself), by MemTracker under
          FakeTensorMode, and by accelerate's estimate (the "Training using
          Adam" column of `accelerate estimate-memory`: estimate_training_usage
          on calculate_maximum_sizes of the local model, weights only), each
          against the measured peak (torch.profiler) of that step.

    PYTHONPATH=build/python .venv/bin/python bench/peers.py [--quick] [--json PATH]
        [--sections fit,lazy,explain,estimate] [--threads 1]

A peer that raises is a result (its exception's first line is reported); the
bench exits 0 when it completes.
"""

import argparse
import contextlib
import gc
import importlib.metadata
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import memfit  # noqa: E402
from memfit import _memfit  # noqa: E402

import _peer_models as pm  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# --- configuration -----------------------------------------------------------

# (model, budget) for the fit comparison. Budgets put the true maximum where
# a step at it takes tens of ms on one core: the truth search, both Lightning
# modes, two accelerate starts and the 20-step checks run ~300 full steps per
# case.
FIT_QUICK = [("mlp", "15MiB"), ("cnn", "24MiB"), ("gpt", "32MiB"), ("lstm", "24MiB")]
FIT_FULL = [("mlp", "15MiB"), ("mlp", "20MiB"), ("cnn", "24MiB"), ("cnn", "64MiB"),
            ("gpt", "32MiB"), ("gpt", "96MiB"), ("lstm", "24MiB"), ("lstm", "64MiB")]
TRUTH_STEPS = 2        # iterations of a truth trial (Adam's state exists from step 1)
SURVIVE_STEPS = 20
ACCEL_STEPS = 2        # steps the accelerate-decorated training runs before returning
ACCEL_STARTS = (128, 8192)
MEMFIT_EXAMPLE = 16    # the example batch handed to find_batch_size
LIGHTNING_DEFAULTS = dict(init_val=2, steps_per_trial=3, max_trials=25, margin=0.05,
                          max_val=8192)

LAZY_QUICK = dict(batch=1024, repeats=3)
LAZY_FULL = dict(batch=4096, repeats=5)
LAZY_BUDGET_FRACTION = 0.5

EXPLAIN_QUICK = [("mlp", 256), ("cnn", 64), ("gpt", 32)]
EXPLAIN_FULL = [("mlp", 512), ("cnn", 128), ("gpt", 64), ("lstm", 256), ("hf-gpt2", 16)]
EXPLAIN_REPEATS = 3

ESTIMATE_QUICK = [("mlp", 2048), ("cnn", 256), ("gpt", 256), ("lstm", 512),
                  ("hf-gpt2", 32), ("hf-bert", 32), ("hf-llama", 32)]
ESTIMATE_FULL = [("mlp", 8192), ("cnn", 1024), ("gpt", 1024), ("lstm", 2048),
                 ("hf-gpt2", 128), ("hf-bert", 128), ("hf-llama", 128)]
PROBE_EXAMPLE = 16     # memfit probes b/4, b/2, b of this example batch


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def first_line(e):
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {line[:220]}"


def where(e, package):
    """The innermost frame of `package` in e's traceback: 'file.py:line in fn'."""
    tb, found = e.__traceback__, None
    while tb is not None:
        f = tb.tb_frame.f_code.co_filename
        if f"/{package}/" in f:
            found = f"{f.split('/' + package + '/', 1)[1]}:{tb.tb_lineno} in {tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    return found


def short(text, n=110):
    """An exception line cut for a table (the JSON keeps it whole)."""
    text = text.split(" (memfit simulated")[0] if "CUDA out of memory" in text else text
    return text if len(text) <= n else text[: n - 3] + "..."


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def pct(x):
    return "-" if x is None else f"{x * 100:+.2f}%"


def err_cell(pred, measured):
    """'+1.23%', with the bytes when the percentage rounds to zero."""
    if pred is None or not measured:
        return "-"
    d = pred - measured
    text = pct(d / measured)
    if d and abs(d / measured) < 5e-5:
        text += f", {'+' if d > 0 else '-'}{fmt_bytes(abs(d))}"
    return text


def md_table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "/") for c in r) + " |")
    return "\n".join(out)


def median_time(fn, repeats):
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def live_tracked():
    return _memfit.tracked_live_bytes("cpu")


def clean():
    gc.collect()
    return live_tracked()


@contextlib.contextmanager
def quiet_fds():
    """Silence the C++ side's prints (kineto's profiler_start lines)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved + [null]:
            os.close(fd)


def versions():
    v = dict(python=platform.python_version(), torch=torch.__version__)
    try:
        v["memfit"] = "0.1.0 @ " + subprocess.run(
            ["git", "-C", ROOT, "describe", "--always", "--dirty"],
            capture_output=True, text=True).stdout.strip()
    except OSError:
        v["memfit"] = "0.1.0"
    for mod, name in (("lightning", "lightning"), ("accelerate", "accelerate"),
                      ("koila", "koila"), ("transformers", "transformers"), ("pynvml", "pynvml")):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # pynvml.smi's deprecation (koila imports it)
                m = __import__(mod)
            v[name] = getattr(m, "__version__", None) or importlib.metadata.version(name)
        except Exception as e:  # noqa: BLE001 (a missing peer is a result)
            v[name] = f"unavailable ({first_line(e)})"
    return v


def all_specs():
    specs = pm.fit_specs()
    hf, hf_version = pm.hf_specs()
    specs.update(hf)
    return specs, hf_version


def adam(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3)


# =============================================================================
# fit
# =============================================================================

class Device:
    """Plain training runs of one (model, budget) on the simulated device,
    each distinct (batch, steps) once."""

    def __init__(self, spec, budget):
        self.spec, self.budget = spec, budget
        self.budget_bytes = memfit.to_bytes(budget)
        self.cache = {}
        self.leaks = []

    def peak(self, b, steps=TRUTH_STEPS):
        """The plain training's peak at b (no budget), by memfit.track."""
        spec = self.spec
        clean()
        with memfit.track() as t:
            model = spec.model()
            opt = adam(model)
            for s in range(steps):
                x, y = spec.batch(b, offset=s * b)
                loss = spec.loss(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                x = y = loss = None
            model = opt = None
        gc.collect()
        return t.peak_bytes

    def run(self, b, steps):
        key = (b, steps)
        if key in self.cache:
            return self.cache[key]
        before = clean()
        if before:
            self.leaks.append(before)
        spec = self.spec
        done, err = 0, None
        t0 = time.perf_counter()
        model = opt = x = y = loss = None
        with memfit.simulated_device(self.budget):
            try:
                model = spec.model()
                opt = adam(model)
                for s in range(steps):
                    x, y = spec.batch(b, offset=s * b)
                    loss = spec.loss(model(x), y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    x = y = loss = None
                    done += 1
            except torch.OutOfMemoryError as e:
                err = first_line(e)
            finally:
                model = opt = x = y = loss = None
        gc.collect()
        r = dict(batch=b, steps=steps, fits=err is None, steps_run=done,
                 seconds=time.perf_counter() - t0, error=err)
        self.cache[key] = r
        return r


def true_max(dev):
    """Largest b whose TRUTH_STEPS-step plain training fits: doubling and
    bisection, then a linear scan (T-2, T-1 fit; T+1, T+2 do not)."""
    runs_before = len(dev.cache)
    size, low, high = 2, 0, None
    while high is None:
        if dev.run(size, TRUTH_STEPS)["fits"]:
            low, size = size, size * 2
            if size > 1 << 16:
                return dict(max_batch=None, error="fits beyond 65536")
        else:
            high = size
    if low == 0:
        if not dev.run(1, TRUTH_STEPS)["fits"]:
            return dict(max_batch=0, monotone_near_boundary=True)
        low = 1
    while high - low > 1:
        mid = (low + high) // 2
        if dev.run(mid, TRUTH_STEPS)["fits"]:
            low = mid
        else:
            high = mid
    T, monotone = low, True
    for b in (T - 2, T - 1):
        if b >= 1:
            monotone &= dev.run(b, TRUTH_STEPS)["fits"]
    b, misses = T + 1, 0
    while misses < 2:
        if dev.run(b, TRUTH_STEPS)["fits"]:
            monotone, T, misses = False, b, 0
        else:
            misses += 1
        b += 1
    return dict(max_batch=T, monotone_near_boundary=monotone,
                runs=len(dev.cache) - runs_before)


class ForwardCounter:
    """Counts a model's forward calls and their batch sizes."""

    def __init__(self, model):
        self.sizes = []
        self.handle = model.register_forward_pre_hook(self._pre)

    def _pre(self, module, args):
        if args and isinstance(args[0], torch.Tensor):
            self.sizes.append(int(args[0].shape[0]))

    def remove(self):
        self.handle.remove()


def memfit_fit(spec, budget):
    """find_batch_size with budget= the device's size. Its probes run on the
    host CPU, as they do beside a GPU (the weights are copied for them), so
    this call is not charged to the simulated device."""
    clean()
    row = dict(method="memfit find_batch_size")
    model = spec.model()
    opt = adam(model)
    x, y = spec.batch(MEMFIT_EXAMPLE)
    counter = ForwardCounter(model)
    t0 = time.perf_counter()
    try:
        fit = memfit.find_batch_size(model, x, y, loss_fn=spec.loss_fn, optimizer=opt,
                                     budget=budget)
        row.update(batch=fit.max_batch, recommended=fit.recommended_batch,
                   predicted_peak_bytes=fit.predicted_peak_bytes, trials=fit.trials)
    except Exception as e:  # noqa: BLE001 (memfit failing is a result too)
        row.update(batch=None, error=first_line(e))
    row["seconds"] = time.perf_counter() - t0
    counter.remove()
    row["probe_forwards"] = list(counter.sizes)
    row["ooms"] = 0
    row["full_steps"] = 0
    del model, opt, x, y
    gc.collect()
    return row


def _lightning_module_class():
    import lightning.pytorch as pl

    class Wrapped(pl.LightningModule):
        """The same nn.Module, Adam, and a DataLoader over the pool."""

        def __init__(self, spec):
            super().__init__()
            self.spec = spec
            self.net = spec.model()
            self.batch_size = 2
            self.step_sizes = []

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.step_sizes.append(int(x.shape[0]))
            return self.spec.loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(pm.PoolDataset(self.spec),
                                               batch_size=self.batch_size, shuffle=False,
                                               num_workers=0)

    return Wrapped


def _trainer(tmp, **kw):
    import lightning.pytorch as pl

    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp, max_epochs=1, **kw)


@contextlib.contextmanager
def lightning_quiet():
    names = ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning")
    levels = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            for n, lv in levels.items():
                logging.getLogger(n).setLevel(lv)


def lightning_fit(spec, budget, mode, tmp):
    import lightning.pytorch.tuner.batch_size_scaling as bss
    from lightning.pytorch.tuner import Tuner

    Wrapped = _lightning_module_class()
    clean()
    ooms = []
    original = bss.is_oom_error

    def counting(e):
        r = original(e)
        if r:
            ooms.append(first_line(e))
        return r

    row = dict(method=f"Lightning {mode}")
    lit = trainer = None
    trials = []
    original_try = bss._try_loop_run

    def traced(trainer, params):
        b = trainer.lightning_module.batch_size
        try:
            original_try(trainer, params)
        except BaseException:
            trials.append((b, False))
            raise
        trials.append((b, True))

    bss.is_oom_error = counting
    bss._try_loop_run = traced
    try:
        with lightning_quiet(), memfit.simulated_device(budget):
            try:
                lit = Wrapped(spec)
                trainer = _trainer(tmp)
                t0 = time.perf_counter()
                try:
                    found = Tuner(trainer).scale_batch_size(lit, mode=mode)
                    row["batch"] = found
                except Exception as e:  # noqa: BLE001 (a peer raising is a result)
                    row.update(batch=None, error=first_line(e), where=where(e, "lightning"))
                row["seconds"] = time.perf_counter() - t0
                row["full_steps"] = len(lit.step_sizes)
                row["tried"] = sorted(set(lit.step_sizes))
            finally:
                lit = trainer = None
    finally:
        bss.is_oom_error = original
        bss._try_loop_run = original_try
    row["ooms"] = len(ooms)
    row["trials"] = trials
    ok = [b for b, fine in trials if fine]
    row["largest_trial_that_ran"] = max(ok) if ok else None
    gc.collect()
    return row


def lightning_survive(spec, budget, batch, tmp):
    """SURVIVE_STEPS steps of Lightning's own fit loop at `batch`."""
    Wrapped = _lightning_module_class()
    clean()
    lit = trainer = None
    out = dict(batch=batch)
    with lightning_quiet(), memfit.simulated_device(budget):
        try:
            lit = Wrapped(spec)
            lit.batch_size = batch
            trainer = _trainer(tmp, max_steps=SURVIVE_STEPS)
            try:
                trainer.fit(lit)
                out["steps_run"] = len(lit.step_sizes)
                out["fits"] = len(lit.step_sizes) >= SURVIVE_STEPS
            except Exception as e:  # noqa: BLE001
                out.update(fits=False, steps_run=max(0, len(lit.step_sizes) - 1),
                           error=first_line(e))
        finally:
            lit = trainer = None
    gc.collect()
    return out


def accelerate_fit(spec, budget, start):
    from accelerate.utils import find_executable_batch_size

    clean()
    tried, steps = [], [0]
    row = dict(method=f"accelerate start {start}" + (" (default)" if start == 128 else ""))
    with memfit.simulated_device(budget):

        @find_executable_batch_size(starting_batch_size=start)
        def train(batch_size):
            tried.append(batch_size)
            model = spec.model()
            opt = adam(model)
            loader = torch.utils.data.DataLoader(pm.PoolDataset(spec), batch_size=batch_size)
            for s, (x, y) in enumerate(loader):
                steps[0] += 1
                loss = spec.loss(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if s + 1 >= ACCEL_STEPS:
                    break
            return batch_size

        t0 = time.perf_counter()
        try:
            row["batch"] = train()
        except Exception as e:  # noqa: BLE001 (a peer raising is a result)
            row.update(batch=None, error=first_line(e))
        row["seconds"] = time.perf_counter() - t0
    row["ooms"] = max(0, len(tried) - (1 if row.get("batch") else 0))
    row["full_steps"] = steps[0]
    row["tried_count"] = len(tried)
    gc.collect()
    return row


def fit_case(spec, budget, tmp):
    dev = Device(spec, budget)

    def guarded(method, fn, *a):
        log(f"  fit {spec.name} @ {budget}: {method}")
        t0 = time.perf_counter()
        try:
            return fn(*a)
        except Exception as e:  # noqa: BLE001 (a peer missing or failing outside its search)
            return dict(method=method, batch=None, error=first_line(e),
                        seconds=time.perf_counter() - t0, ooms=0, full_steps=0)

    rows = [guarded("memfit find_batch_size", memfit_fit, spec, budget)]
    for mode in ("power", "binsearch"):
        rows.append(guarded(f"Lightning {mode}", lightning_fit, spec, budget, mode, tmp))
    for start in ACCEL_STARTS:
        rows.append(guarded(f"accelerate start {start}" + (" (default)" if start == 128 else ""),
                            accelerate_fit, spec, budget, start))
    log(f"  fit {spec.name} @ {budget}: true maximum")
    t0 = time.perf_counter()
    truth = true_max(dev)
    truth["seconds"] = time.perf_counter() - t0
    T = truth.get("max_batch")
    base = rows[0]["seconds"]
    for r in rows:
        b = r.get("batch")
        r["found_over_true"] = (b / T) if (b and T) else None
        r["wall_ratio"] = r["seconds"] / base if base else None
        if b:
            log(f"  fit {spec.name} @ {budget}: {r['method']} b={b}: {SURVIVE_STEPS} plain steps")
            s = dev.run(b, SURVIVE_STEPS)
            r["survives"] = s["fits"]
            r["survive_steps_run"] = s["steps_run"]
            if r["method"].startswith("memfit"):
                r["measured_peak_bytes"] = dev.peak(b)
                rec = r.get("recommended")
                if rec and rec != b:
                    r["recommended_survives"] = dev.run(rec, SURVIVE_STEPS)["fits"]
            if r["method"].startswith(("Lightning", "memfit")):
                # memfit's batch too: would a Lightning user's training run it?
                log(f"  fit {spec.name} @ {budget}: {r['method']} b={b}: "
                    f"{SURVIVE_STEPS} Lightning steps")
                try:
                    r["lightning_loop"] = lightning_survive(spec, budget, b, tmp)
                except Exception as e:  # noqa: BLE001 (Lightning missing)
                    r["lightning_loop"] = dict(batch=b, fits=False, steps_run=0,
                                               error=first_line(e))
    return dict(model=spec.name, note=spec.note, budget=budget, true_max=T, truth=truth,
                rows=rows, leaks=dev.leaks)


def run_fit(cases, specs):
    out = []
    with tempfile.TemporaryDirectory(prefix="memfit-peers-") as tmp:
        for name, budget in cases:
            spec = specs[name]
            spec.pool()
            t0 = time.perf_counter()
            try:
                c = fit_case(spec, budget, tmp)
            except Exception as e:  # noqa: BLE001 (report and go on)
                c = dict(model=name, budget=budget, error=first_line(e), rows=[])
            c["case_seconds"] = time.perf_counter() - t0
            log(f"  fit {name} @ {budget}: done in {c['case_seconds']:.0f} s")
            out.append(c)
    return out


def fit_tables(cases):
    head = ["model", "budget", "true max", "method", "batch", "found/true", "OOMs",
            "full-size steps", "wall s", "wall / memfit", "survives 20", "note"]
    rows = []
    for c in cases:
        if c.get("error"):
            rows.append([c["model"], c["budget"], "-", "(case failed)", "-", "-", "-", "-", "-",
                         "-", "-", c["error"]])
            continue
        for r in c["rows"]:
            note = []
            if r.get("error"):
                note.append("raised " + short(r["error"]) + (
                    f" at lightning/{r['where']}" if r.get("where") else ""))
            if r["method"].startswith("memfit"):
                if r.get("predicted_peak_bytes") is not None and r.get("measured_peak_bytes"):
                    note.append(f"peak at {r['batch']}: predicted {fmt_bytes(r['predicted_peak_bytes'])}, "
                                f"measured {fmt_bytes(r['measured_peak_bytes'])}")
                if r.get("recommended") is not None:
                    rs = r.get("recommended_survives")
                    note.append(f"recommended {r['recommended']}" + (
                        "" if rs is None else f" (survives 20: {'yes' if rs else 'NO'})"))
                pf = r.get("probe_forwards", [])
                note.append(f"{len(pf)} small steps (batches {','.join(map(str, sorted(set(pf))))})")
            if r.get("lightning_loop"):
                ll = r["lightning_loop"]
                note.append("Lightning loop: " + (
                    f"{SURVIVE_STEPS} ran" if ll.get("fits")
                    else f"OOM after {ll.get('steps_run')} steps ({short(ll.get('error', ''), 60)})"))
            if r["method"].startswith("Lightning"):
                tr = r.get("trials", [])
                note.append(f"{len(tr)} trials: " + ",".join(
                    f"{b}{'' if fine else '✗'}" for b, fine in tr))
            if r.get("batch") and c["true_max"] and r["batch"] > c["true_max"]:
                note.append("ABOVE the true max")
            surv = r.get("survives")
            rows.append([
                c["model"], c["budget"], c["true_max"], r["method"],
                r.get("batch") if r.get("batch") is not None else "-",
                f"{r['found_over_true']:.3f}" if r.get("found_over_true") is not None else "-",
                r.get("ooms", "-"), r.get("full_steps", "-"), f"{r['seconds']:.2f}",
                f"{r['wall_ratio']:.1f}x" if r.get("wall_ratio") is not None else "-",
                "-" if surv is None else ("yes" if surv else f"NO (OOM at step {r['survive_steps_run'] + 1})"),
                "; ".join(note),
            ])
    detail = md_table(head, rows)

    by = {}
    for c in cases:
        for r in c.get("rows", []):
            d = by.setdefault(r["method"], dict(found=[], wall=[], ooms=0, steps=0, surv=0,
                                                 n=0, failed=0, above=0))
            d["n"] += 1
            if r.get("found_over_true") is not None:
                d["found"].append(r["found_over_true"])
            else:
                d["failed"] += 1
            if r.get("wall_ratio"):
                d["wall"].append(r["wall_ratio"])
            d["ooms"] += r.get("ooms", 0) or 0
            d["steps"] += r.get("full_steps", 0) or 0
            d["surv"] += 1 if r.get("survives") else 0
            if r.get("batch") and c.get("true_max") and r["batch"] > c["true_max"]:
                d["above"] += 1
    srows = []
    for m, d in by.items():
        gm = math.exp(statistics.mean(math.log(w) for w in d["wall"])) if d["wall"] else None
        srows.append([
            m,
            f"{statistics.mean(d['found']):.3f}" if d["found"] else "-",
            f"{min(d['found']):.3f}" if d["found"] else "-",
            f"{d['above']}", f"{d['surv']}/{d['n']}", d["ooms"], d["steps"],
            f"{gm:.1f}x" if gm else "-", d["failed"],
        ])
    own = []
    for c in cases:
        for r in c.get("rows", []):
            if r["method"] == "Lightning binsearch" and r.get("trials"):
                ok = [b for b, fine in r["trials"] if fine]
                bad = [b for b, fine in r["trials"] if not fine]
                above = [b for b in bad if b > max(ok)] if ok else []
                if above and min(above) == max(ok) + 1:
                    own.append((c["model"], c["budget"], max(ok), c["true_max"]))
    lower = [f"{m} @ {bud}: {o} (plain {t})" for m, bud, o, t in own if t and o < t]
    footnote = ""
    if own:
        footnote = ("\n\nLightning's own maximum, read off its binsearch trials (largest that "
                    "ran, the next size failed), equals the plain training's in "
                    f"{len(own) - len(lower)} of {len(own)} cases")
        footnote += (("; below it in " + ", ".join(lower) + ": Lightning's fit loop holds one "
                      "batch more (its training data fetcher prefetches 1 batch).")
                     if lower else ".")
    summary = md_table(["method", "found/true mean", "min", "above true max", "survive 20",
                        "OOMs (all cases)", "full-size steps (all)", "wall / memfit (geo. mean)",
                        "no batch"], srows) + footnote
    return detail, summary


# =============================================================================
# lazy
# =============================================================================

class KoilaReadme(nn.Module):
    """koila's README model (PyTorch's quickstart network)."""

    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(28 * 28, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
            nn.Linear(512, 10))

    def forward(self, x):
        return self.linear_relu_stack(self.flatten(x))


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(64, 4, batch_first=True)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        h, _ = self.attn(x, x, x)
        return self.head(h.mean(1))


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(28, 64, batch_first=True)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        h, _ = self.lstm(x)
        return self.head(h[:, -1])


class Reshaped(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x.reshape(x.shape[0], -1))))


LAZY_CASES = [
    ("koila README (Flatten+Linear)", KoilaReadme, (28, 28)),
    ("nn.MultiheadAttention", Attention, (16, 64)),
    ("nn.LSTM", Recurrent, (16, 28)),
    ("x.reshape(x.shape[0], -1)", Reshaped, (28, 28)),
]


@contextlib.contextmanager
def koila_sees_simulated_gpu(budget_bytes, sizes):
    """koila asks NVML for free GPU memory and splits only when CUDA is
    available; here it is told the simulated device's free bytes instead."""
    import koila.gpus  # noqa: F401
    import koila.lazy  # noqa: F401

    kg = sys.modules["koila.gpus"]
    kl = sys.modules["koila.lazy"]  # koila.lazy the attribute is the function

    saved = (kg.free_memory, kl.cuda, kg.split_batch)
    orig_split = kg.split_batch

    def split(*a, **k):
        for s in orig_split(*a, **k):
            sizes.append(s)
            yield s

    kg.free_memory = lambda: budget_bytes - live_tracked()
    kl.cuda = types.SimpleNamespace(is_available=lambda: True)
    kg.split_batch = split
    try:
        yield
    finally:
        kg.free_memory, kl.cuda, kg.split_batch = saved


def _grad_error(model, ref):
    """(max over parameters of max|g - g_eager| / max|g_eager|, the norm of
    all gradients over the eager norm)."""
    worst, num, den = 0.0, 0.0, 0.0
    for p, r in zip(model.parameters(), ref):
        if p.grad is None:
            return float("inf"), None
        scale = r.abs().max().item() or 1.0
        worst = max(worst, (p.grad - r).abs().max().item() / scale)
        num += p.grad.double().pow(2).sum().item()
        den += r.double().pow(2).sum().item()
    return worst, math.sqrt(num / den) if den else None


def lazy_case(label, make, shape, batch, repeats):
    loss_fn = nn.CrossEntropyLoss()
    torch.manual_seed(0)
    model = make()
    x = torch.randn(batch, *shape)
    y = torch.randint(0, 10, (batch,))

    def eager():
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()

    eager()
    ref = [p.grad.clone() for p in model.parameters()]

    def eager_peak_at(n):
        clean()
        model.zero_grad(set_to_none=True)
        xs, ys = x[:n].clone(), y[:n].clone()
        with memfit.track() as t:
            model.zero_grad(set_to_none=True)
            loss_fn(model(xs), ys).backward()
        model.zero_grad(set_to_none=True)
        return t.peak_bytes

    eager_peak = eager_peak_at(batch)
    fixed = eager_peak_at(1)  # gradients and what does not grow with the batch
    model.zero_grad(set_to_none=True)
    t_eager = median_time(eager, repeats)
    # Half of what grows with the batch: eager runs out, chunks of half fit.
    budget = int(fixed + LAZY_BUDGET_FRACTION * (eager_peak - fixed))
    rows = []

    def attempt(method, wrap, budgeted):
        clean()
        r = dict(case=label, method=method, budget=budget if budgeted else None)

        def once():
            model.zero_grad(set_to_none=True)
            ctx = memfit.simulated_device(budget) if budgeted else contextlib.nullcontext()
            with ctx:
                xl, yl = wrap(x, y)
                loss = loss_fn(model(xl), yl)
                loss.backward()

        try:
            t0 = time.perf_counter()
            once()
            r["first_seconds"] = time.perf_counter() - t0
            r["grad_error"], r["grad_norm_ratio"] = _grad_error(model, ref)
            r["ok"] = True
        except Exception as e:  # noqa: BLE001 (a method raising is a result)
            r.update(ok=False, error=first_line(e))
        gc.collect()
        base = t_eager
        if r["ok"] and repeats > 1:
            # Later calls (memfit caches what its probes learnt per shapes),
            # interleaved with the eager step so that load hits both alike.
            mine, theirs = [], []
            try:
                for _ in range(repeats):
                    theirs.append(median_time(eager, 1))
                    mine.append(median_time(once, 1))
                r["seconds"] = statistics.median(mine)
                base = statistics.median(theirs)
            except Exception as e:  # noqa: BLE001
                r["seconds"] = None
                r["later_error"] = first_line(e)
        else:
            r["seconds"] = r.get("first_seconds")
        if r["ok"]:
            r["first_ratio"] = r["first_seconds"] / t_eager
            r["time_ratio"] = r["seconds"] / base if r["seconds"] else None
        gc.collect()
        return r

    import koila

    def memfit_wrap(a, b):
        return memfit.lazy(a, b, batch=0)

    def koila_wrap(a, b):
        return koila.lazy(a, b, batch=0)

    r = attempt("eager", lambda a, b: (a, b), True)
    r["method"] = "eager (full batch)"
    rows.append(r)
    for budgeted in (False, True):
        r = attempt("memfit.lazy", memfit_wrap, budgeted)
        if r.get("ok"):
            run = memfit.last_lazy_run()
            r["chunks"] = [size for _, size in run.chunks] if run is not None else None
            r["lazy_ooms_recovered"] = getattr(run, "ooms", None)
        rows.append(r)
        r = attempt("koila.lazy", koila_wrap, budgeted)
        rows.append(r)
    sizes = []
    with koila_sees_simulated_gpu(budget, sizes):
        r = attempt("koila.lazy, sim. GPU", koila_wrap, True)
    first, total = [], 0
    for s in sizes:  # the first call's chunks (later calls split again)
        if total >= batch:
            break
        first.append(s)
        total += s
    r["chunks"] = first
    rows.append(r)
    return dict(case=label, batch=batch, eager_peak=eager_peak, budget=budget,
                eager_seconds=t_eager, rows=rows)


def run_lazy(cfg):
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pynvml.smi's deprecation, on koila's import
        import koila  # noqa: F401
    for label, make, shape in LAZY_CASES:
        log(f"  lazy {label}")
        try:
            out.append(lazy_case(label, make, shape, cfg["batch"], cfg["repeats"]))
        except Exception as e:  # noqa: BLE001
            out.append(dict(case=label, error=first_line(e), rows=[]))
    return out


def lazy_table(cases):
    head = ["case", "method", "budget", "result", "grad max rel. error",
            "time / eager (first call / later calls)", "chunks"]
    rows = []
    for c in cases:
        if c.get("error"):
            rows.append([c["case"], "(case failed)", "-", c["error"], "-", "-", "-"])
            continue
        for r in c["rows"]:
            budget = fmt_bytes(r["budget"]) if r.get("budget") else "none"
            if r.get("ok"):
                res, err = "runs", r["grad_error"]
                gerr = f"{err:.2e}" if err < 1e-2 else (
                    f"{err:.3f} (gradient norm {r['grad_norm_ratio']:.2f}x eager's)")
                if math.isinf(err):
                    gerr = "no gradient"
                tr = f"{r['first_ratio']:.2f}x / " + (
                    f"{r['time_ratio']:.2f}x" if r.get("time_ratio") else r.get("later_error", "-"))
            else:
                res, gerr, tr = f"raises {short(r['error'])}", "-", "-"
            ch = r.get("chunks")
            if isinstance(ch, list):
                ch = "+".join(map(str, ch)) if ch else "no split"
            rows.append([c["case"], r["method"], budget, res, gerr, tr, ch if ch else "-"])
    return md_table(head, rows) + (
        "\n\nBatch {}; eager full-batch peak (memfit.track) {}. The budget keeps what "
        "batch 1 needs (gradients...) plus half of what grows with the batch. Time ratios: "
        "over the eager step without a budget (later calls: medians, interleaved).".format(
            next((c["batch"] for c in cases if c.get("batch")), "?"),
            ", ".join(f"{c['case']} {fmt_bytes(c.get('eager_peak'))}" for c in cases
                      if not c.get("error"))))


# =============================================================================
# explain and estimate: one step, measured
# =============================================================================

def model_state_bytes(model):
    seen, n = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        st = t.untyped_storage()
        if st.data_ptr() in seen:
            continue
        seen.add(st.data_ptr())
        n += st.nbytes()
    return n


def plain_iterations(spec, model, xh, yh, iterations=2):
    """The step memfit profiles: per iteration a fresh copy of the batch,
    forward, loss, backward, Adam step, zero_grad(set_to_none); fresh Adam."""
    opt = adam(model)
    for _ in range(iterations):
        x, y = xh.clone(), yh.clone()
        loss = spec.loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, y, loss
    del opt


def profiler_peak(spec, model, xh, yh):
    """Peak bytes of the step by torch.profiler's CPU allocator events (the
    model's weights, allocated before, added)."""
    from torch.profiler import ProfilerActivity, profile

    model.zero_grad(set_to_none=True)
    with quiet_fds():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            plain_iterations(spec, model, xh, yh)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    cur = peak = 0
    for e in events:
        cur += e.nbytes()
        peak = max(peak, cur)
    return model_state_bytes(model) + peak


def track_peak(spec, model, xh, yh):
    model.zero_grad(set_to_none=True)
    clean()
    with memfit.track() as t:
        plain_iterations(spec, model, xh, yh)
    return model_state_bytes(model) + t.peak_bytes


_MT_CATEGORY = {"Parameter": "parameter", "Buffer": "buffer", "Gradient": "gradient",
                "Activation": "activation", "Temp": "temporary", "Optstate": "optimizer_state",
                "Other": "other"}


def memtracker_eager(spec, model, xh, yh):
    from torch.distributed._tools.mem_tracker import MemTracker, _ModState

    model.zero_grad(set_to_none=True)
    mt = MemTracker()
    mt.track_external(model)
    opt = None
    with mt:
        opt = adam(model)
        for it in range(2):
            x, y = xh.clone(), yh.clone()
            loss = spec.loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del x, y, loss
            if it == 0:
                mt.reset_mod_stats()
    snap = mt.get_tracker_snapshot("peak")
    dev = next(iter(snap)) if snap else None
    cats = {}
    total = None
    if dev is not None:
        for k, v in snap[dev].items():
            key = getattr(k, "value", k)
            if key == "Total":
                total = v
            else:
                cats[_MT_CATEGORY.get(key, key)] = v
    modules = {}
    for stats in mt.memory_tracking.values():
        name = stats.mod_fqn
        snaps = stats.snapshots
        try:
            pre = snaps[_ModState.PRE_FW][-1][dev]["Total"]
            post = snaps[_ModState.POST_FW][-1][dev]["Total"]
            peak_fw = snaps[_ModState.PEAK_FW][-1][dev]["Total"]
            modules[name] = dict(forward_retained=post - pre, forward_peak_above=peak_fw - pre)
        except (KeyError, IndexError, TypeError):
            continue
    del opt
    return dict(peak=total, categories=cats, modules=modules)


def memtracker_fake(spec, batch):
    """MemTracker under FakeTensorMode: model, Adam and batch are fake."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    with FakeTensorMode():
        model = spec.model()
        opt = adam(model)
        xh, yh = spec.sample_x(batch), spec.sample_y(batch)
        mt = MemTracker()
        mt.track_external(model, opt)
        with mt:
            for it in range(2):
                x, y = xh.clone(), yh.clone()
                loss = spec.loss(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                del x, y, loss
                if it == 0:
                    mt.reset_mod_stats()
    snap = mt.get_tracker_snapshot("peak")
    dev = next(iter(snap))
    return snap[dev]["Total"]


def accelerate_estimate(model):
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes

    total, _largest = calculate_maximum_sizes(model)
    usage = estimate_training_usage(total, "float32")
    return max(usage.values()), total  # the command prints the max as "Training using Adam"


def explain_case(spec, batch):
    model = spec.model()
    xh, yh = spec.batch(batch)
    measured = profiler_peak(spec, model, xh, yh)
    tracked = track_peak(spec, model, xh, yh)
    clean()
    report = memfit.profile(model, xh, yh, loss_fn=spec.loss_fn, optimizer="adam")
    mt = memtracker_eager(spec, model, xh, yh)
    clean()
    # Wall times, interleaved: plain, memfit.profile, MemTracker.
    plain_t, prof_t, mt_t = [], [], []
    for _ in range(EXPLAIN_REPEATS):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        plain_iterations(spec, model, xh, yh)
        t1 = time.perf_counter()
        memfit.profile(model, xh, yh, loss_fn=spec.loss_fn, optimizer="adam")
        t2 = time.perf_counter()
        memtracker_eager(spec, model, xh, yh)
        t3 = time.perf_counter()
        plain_t.append(t1 - t0)
        prof_t.append(t2 - t1)
        mt_t.append(t3 - t2)
        gc.collect()
    p = statistics.median(plain_t)
    mf_modules = {name: b for name, b in report.modules}
    return dict(
        model=spec.name, batch=batch, measured=measured, tracked=tracked,
        memfit=dict(peak=report.peak_bytes, phase=f"{report.peak_phase}#{report.peak_iteration}",
                    categories=dict(report.categories_at_peak), modules=mf_modules,
                    overhead=statistics.median(prof_t) / p),
        memtracker=dict(peak=mt["peak"], categories=mt["categories"], modules=mt["modules"],
                        overhead=statistics.median(mt_t) / p),
        plain_seconds=p,
    )


def run_explain(cases, specs):
    out = []
    for name, batch in cases:
        if name not in specs:
            out.append(dict(model=name, batch=batch, error="model unavailable"))
            continue
        log(f"  explain {name} @ {batch}")
        try:
            out.append(explain_case(specs[name], batch))
        except Exception as e:  # noqa: BLE001
            out.append(dict(model=name, batch=batch, error=first_line(e)))
        gc.collect()
    return out


def explain_tables(cases):
    parts = []
    head = ["model", "batch", "measured peak (torch.profiler)", "memfit.track", "memfit.profile",
            "error", "MemTracker", "error", "profile time / step", "MemTracker time / step"]
    rows = []
    for c in cases:
        if c.get("error"):
            rows.append([c["model"], c["batch"], c["error"]] + ["-"] * 7)
            continue
        m = c["measured"]
        rows.append([
            c["model"], c["batch"], fmt_bytes(m), fmt_bytes(c["tracked"]),
            fmt_bytes(c["memfit"]["peak"]), err_cell(c["memfit"]["peak"], m),
            fmt_bytes(c["memtracker"]["peak"]), err_cell(c["memtracker"]["peak"], m),
            f"{c['memfit']['overhead']:.2f}x", f"{c['memtracker']['overhead']:.2f}x",
        ])
    parts.append(md_table(head, rows))
    cats = ["parameter", "buffer", "input", "activation", "gradient", "optimizer_state",
            "temporary", "other"]
    for c in cases:
        if c.get("error"):
            continue
        mf, mt = c["memfit"]["categories"], c["memtracker"]["categories"]
        rows = [[k, fmt_bytes(mf.get(k, 0)), fmt_bytes(mt.get(k)) if k in mt else "(no such category)"]
                for k in cats]
        rows.append(["**total**", fmt_bytes(c["memfit"]["peak"]), fmt_bytes(c["memtracker"]["peak"])])
        parts.append(f"Categories at the peak, {c['model']} batch {c['batch']} "
                     f"(memfit's peak in {c['memfit']['phase']}):\n\n"
                     + md_table(["category", "memfit.profile", "MemTracker"], rows))
        mods = c["memfit"]["modules"]
        mtm = c["memtracker"]["modules"]
        root = next((k for k in mtm if "." not in k), None)

        def mt_lookup(name):
            key = name if name == "(top level)" else (f"{root}.{name}" if root else name)
            if name == "(top level)":
                key = root
            return mtm.get(key)

        names = sorted(mods, key=lambda k: -mods[k])[:6]
        extra = [k.split(".", 1)[1] for k in sorted(mtm, key=lambda k: -mtm[k]["forward_retained"])
                 if "." in k][:6]
        for n in extra:
            if n not in names:
                names.append(n)
        rows = []
        for n in names[:10]:
            e = mt_lookup(n)
            rows.append([n, fmt_bytes(mods.get(n)) if n in mods else "-",
                         fmt_bytes(e["forward_retained"]) if e else "-",
                         fmt_bytes(e["forward_peak_above"]) if e else "-"])
        parts.append(f"Per module, {c['model']} batch {c['batch']}:\n\n" + md_table(
            ["module", "memfit: activations saved for backward",
             "MemTracker: bytes its forward left alive (post-fw minus pre-fw)",
             "MemTracker: forward peak above pre-fw"], rows))
    return "\n\n".join(parts)


def estimate_case(spec, batch):
    r = dict(model=spec.name, note=spec.note, batch=batch)
    model = spec.model()
    r["parameters"] = sum(p.numel() for p in model.parameters())
    xh, yh = spec.batch(batch)
    t0 = time.perf_counter()
    r["measured"] = profiler_peak(spec, model, xh, yh)
    r["measured_seconds"] = time.perf_counter() - t0
    clean()
    # memfit, probes: a profile at the example batch, its probes b/4, b/2, b.
    xs, ys = spec.batch(PROBE_EXAMPLE)
    t0 = time.perf_counter()
    try:
        rep = memfit.profile(model, xs, ys, loss_fn=spec.loss_fn, optimizer="adam")
        r["memfit_probes"] = rep.predict_peak_bytes(batch)
    except Exception as e:  # noqa: BLE001
        r["memfit_probes_error"] = first_line(e)
    r["memfit_probes_seconds"] = time.perf_counter() - t0
    clean()
    # memfit, meta mode at the batch itself.
    t0 = time.perf_counter()
    try:
        rep = memfit.profile(model, xh, yh, loss_fn=spec.loss_fn, optimizer="adam", mode="meta")
        r["memfit_meta"] = rep.peak_bytes
        r["memfit_meta_mode"] = rep.mode
        r["memfit_meta_notes"] = list(rep.notes)
    except Exception as e:  # noqa: BLE001
        r["memfit_meta_error"] = first_line(e)
    r["memfit_meta_seconds"] = time.perf_counter() - t0
    clean()
    t0 = time.perf_counter()
    try:
        r["memtracker_fake"] = memtracker_fake(spec, batch)
    except Exception as e:  # noqa: BLE001 (a peer raising is a result)
        r["memtracker_fake_error"] = first_line(e)
    r["memtracker_fake_seconds"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        r["accelerate"], r["accelerate_model_bytes"] = accelerate_estimate(model)
    except Exception as e:  # noqa: BLE001
        r["accelerate_error"] = first_line(e)
    r["accelerate_seconds"] = time.perf_counter() - t0
    return r


def run_estimate(cases, specs):
    out = []
    for name, batch in cases:
        if name not in specs:
            out.append(dict(model=name, batch=batch, error="model unavailable (transformers?)"))
            continue
        log(f"  estimate {name} @ {batch}")
        try:
            out.append(estimate_case(specs[name], batch))
        except Exception as e:  # noqa: BLE001
            out.append(dict(model=name, batch=batch, error=first_line(e)))
        gc.collect()
    return out


def estimate_table(cases):
    methods = [("memfit_probes", "memfit probes 4,8,16"), ("memfit_meta", "memfit meta"),
               ("memtracker_fake", "MemTracker + FakeTensorMode"),
               ("accelerate", "accelerate estimate (Adam)")]
    head = ["model", "batch", "measured peak"] + [f"{label}" for _, label in methods]
    rows, times = [], []
    errs = {k: [] for k, _ in methods}
    for c in cases:
        if c.get("error"):
            rows.append([c["model"], c["batch"], c["error"]] + ["-"] * len(methods))
            continue
        m = c["measured"]
        row = [f"{c['model']} ({c['parameters'] / 1e6:.2f}M params)", c["batch"], fmt_bytes(m)]
        trow = [c["model"], f"{c['measured_seconds']:.2f}"]
        for k, _ in methods:
            if k in c:
                e = c[k] / m - 1
                cell = f"{fmt_bytes(c[k])} ({err_cell(c[k], m)})"
                if k == "memfit_meta" and c.get("memfit_meta_mode") != "meta":
                    # Fell back to running the step for real: a measurement,
                    # not an estimate; left out of the means.
                    cell += f" [fell back to {c.get('memfit_meta_mode')}: not an estimate]"
                else:
                    errs[k].append(abs(e))
                row.append(cell)
            else:
                row.append(f"raises {c.get(k + '_error', '?')}")
            trow.append(f"{c.get(k + '_seconds', 0):.2f}")
        rows.append(row)
        times.append(trow)
    srow = ["**mean abs. error**", "", ""] + [
        f"{statistics.mean(v) * 100:.2f}% ({len(v)} models)" if v else "-" for k, v in errs.items()]
    rows.append(srow)
    srow = ["**max abs. error**", "", ""] + [
        f"{max(v) * 100:.2f}%" if v else "-" for k, v in errs.items()]
    rows.append(srow)
    t = md_table(head, rows)
    t2 = md_table(["model", "measured step s"] + [f"{label} s" for _, label in methods], times)
    notes = []
    for c in cases:
        for n in c.get("memfit_meta_notes", []) or []:
            notes.append(f"- {c['model']}: memfit meta note: {n}")
    return t + "\n\nWall time of each estimate (seconds):\n\n" + t2 + (
        "\n\n" + "\n".join(notes) if notes else "")


# =============================================================================

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller cases (under 20 min)")
    ap.add_argument("--json", metavar="PATH", help="write every figure as JSON to PATH")
    ap.add_argument("--sections", default="fit,lazy,explain,estimate")
    ap.add_argument("--models", default=None,
                    help="only these models in fit/explain/estimate (comma list)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: the machine is shared)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    only = set(args.models.split(",")) if args.models else None

    def pick(cases):
        return [c for c in cases if only is None or c[0] in only]

    t_start = time.perf_counter()

    specs, hf_version = all_specs()
    v = versions()
    if not specs.get("hf-gpt2"):
        v["transformers"] = hf_version
    print(f"# memfit beside its peers ({'quick' if args.quick else 'full'} run)\n")
    print("Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()))
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores, torch threads "
          f"{torch.get_num_threads()}; every figure below measured in this run.\n")
    results = dict(versions=v, quick=args.quick, threads=args.threads)

    if "fit" in sections:
        log("fit ...")
        t0 = time.perf_counter()
        fit = run_fit(pick(FIT_QUICK if args.quick else FIT_FULL), specs)
        results["fit"] = fit
        detail, summary = fit_tables(fit)
        print("## fit: the largest batch under a budget (simulated device)\n")
        print(detail + "\n")
        print("Summary over the cases:\n")
        print(summary + "\n")
        leaks = [(c["model"], c["budget"], c.get("leaks")) for c in fit if c.get("leaks")]
        if leaks:
            print(f"Bytes left tracked between runs (should be none): {leaks}\n")
        print(f"(fit section: {time.perf_counter() - t0:.0f} s)\n")

    if "lazy" in sections:
        log("lazy ...")
        t0 = time.perf_counter()
        lz = run_lazy(LAZY_QUICK if args.quick else LAZY_FULL)
        results["lazy"] = lz
        print("## lazy: memfit.lazy vs koila.lazy\n")
        print(lazy_table(lz) + "\n")
        print(f"(lazy section: {time.perf_counter() - t0:.0f} s)\n")

    if "explain" in sections:
        log("explain ...")
        t0 = time.perf_counter()
        ex = run_explain(pick(EXPLAIN_QUICK if args.quick else EXPLAIN_FULL), specs)
        results["explain"] = ex
        print("## explain: memfit.profile vs torch's MemTracker on one step\n")
        print(explain_tables(ex) + "\n")
        print(f"(explain section: {time.perf_counter() - t0:.0f} s)\n")

    if "estimate" in sections:
        log("estimate ...")
        t0 = time.perf_counter()
        es = run_estimate(pick(ESTIMATE_QUICK if args.quick else ESTIMATE_FULL), specs)
        results["estimate"] = es
        print("## estimate: the peak at a large batch, predicted vs measured\n")
        print(estimate_table(es) + "\n")
        print(f"(estimate section: {time.perf_counter() - t0:.0f} s)\n")

    wall = time.perf_counter() - t_start
    results["wall_seconds"] = wall
    print(f"wall time {wall:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
