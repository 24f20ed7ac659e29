"""fit: the largest batch under a budget on memfit's simulated device, by
memfit.find_batch_size, Lightning's Tuner.scale_batch_size (power and
binsearch) and accelerate's find_executable_batch_size (starts 128 and 8192),
each against the true maximum found by running plain training steps, and
each found batch run for SURVIVE_STEPS more steps (bench/peers.py's
docstring says how)."""

import gc
import math
import statistics
import tempfile
import time

import torch

import memfit

import _peer_models as pm
from peers.common import (adam, clean, first_line, fmt_bytes, log, md_table, quiet_loggers,
                          short, where)

__all__ = ["HEADING", "run", "report", "Device", "true_max"]

HEADING = "fit: the largest batch under a budget (simulated device)"

# (model, budget). Budgets put the true maximum where a step at it takes tens
# of ms on one core: the truth search, both Lightning modes, two accelerate
# starts and the 20-step checks run ~300 full steps per case.
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
        clean()
        with memfit.track() as t:
            self._train(b, steps, [])
        gc.collect()
        return t.peak_bytes

    def _train(self, b, steps, done):
        """Plain training of a fresh model and Adam; appends each step done."""
        spec = self.spec
        model = spec.model()
        opt = adam(model)
        for s in range(steps):
            x, y = spec.batch(b, offset=s * b)
            loss = spec.loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            x = y = loss = None
            done.append(s)

    def run(self, b, steps):
        key = (b, steps)
        if key in self.cache:
            return self.cache[key]
        before = clean()
        if before:
            self.leaks.append(before)
        done, err = [], None
        t0 = time.perf_counter()
        with memfit.simulated_device(self.budget):
            try:
                self._train(b, steps, done)
            except torch.OutOfMemoryError as e:
                err = first_line(e)
        gc.collect()
        r = dict(batch=b, steps=steps, fits=err is None, steps_run=len(done),
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


def lightning_quiet():
    return quiet_loggers("lightning", "lightning.pytorch", "lightning.fabric",
                         "pytorch_lightning")


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



def run(quick, pick, specs):
    return run_fit(pick(FIT_QUICK if quick else FIT_FULL), specs)


def report(cases):
    detail, summary = fit_tables(cases)
    text = detail + "\n\nSummary over the cases:\n\n" + summary
    leaks = [(c["model"], c["budget"], c.get("leaks")) for c in cases if c.get("leaks")]
    if leaks:
        text += f"\n\nBytes left tracked between runs (should be none): {leaks}"
    return text
