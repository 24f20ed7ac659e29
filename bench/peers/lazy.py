"""lazy: memfit.lazy against koila.lazy on koila's README model and on the
layers koila's issues report it fails on (nn.MultiheadAttention, nn.LSTM, a
reshape), without a budget and under half of what grows with the batch;
gradients against the eager full batch."""

import contextlib
import gc
import math
import statistics
import sys
import time
import types
import warnings

import torch
import torch.nn as nn

import memfit
from peers.common import (clean, first_line, fmt_bytes, live_tracked, log, md_table,
                          median_time, short)

__all__ = ["HEADING", "run", "report"]

HEADING = "lazy: memfit.lazy vs koila.lazy"

LAZY_QUICK = dict(batch=1024, repeats=3)
LAZY_FULL = dict(batch=4096, repeats=5)
LAZY_BUDGET_FRACTION = 0.5

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


def run(quick, pick, specs):
    return run_lazy(LAZY_QUICK if quick else LAZY_FULL)


report = lazy_table
