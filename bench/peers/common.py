"""What every comparison of bench/peers.py shares: the log, the printers
(bench/_tables.py's, re-exported), the versions line, the models, and the
measured step that explain and estimate hold their figures against."""

import contextlib
import gc
import importlib.metadata
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings

import torch

from memfit import _memfit

import _peer_models as pm
from _tables import err_cell, fmt_bytes, md_table, pct

__all__ = ["quiet_loggers", "ROOT", "log", "first_line", "where", "short", "fmt_bytes", "pct", "err_cell",
           "md_table", "median_time", "live_tracked", "clean", "quiet_fds", "versions",
           "all_specs", "adam", "run_cases", "model_state_bytes", "plain_iterations",
           "profiler_peak"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def run_cases(section, cases, specs, case_fn, missing="model unavailable"):
    """case_fn(spec, batch) for each (model, batch); a case that raises, or
    whose model is missing, is a row with its error."""
    out = []
    for name, batch in cases:
        if name not in specs:
            out.append(dict(model=name, batch=batch, error=missing))
            continue
        log(f"  {section} {name} @ {batch}")
        try:
            out.append(case_fn(specs[name], batch))
        except Exception as e:  # noqa: BLE001
            out.append(dict(model=name, batch=batch, error=first_line(e)))
        gc.collect()
    return out


# --- the measured step explain and estimate compare with ---------------------

def model_state_bytes(model):
    seen, n = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        st = t.untyped_storage()
        if st.data_ptr() in seen:
            continue
        seen.add(st.data_ptr())
        n += st.nbytes()
    return n


def plain_iterations(spec, model, xh, yh, iterations=2, opt=None, after_first=None):
    """The step memfit profiles: per iteration a fresh copy of the batch,
    forward, loss, backward, Adam step, zero_grad(set_to_none); a fresh Adam
    unless `opt` is given. after_first() runs after the first iteration."""
    opt = adam(model) if opt is None else opt
    for it in range(iterations):
        x, y = xh.clone(), yh.clone()
        loss = spec.loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, y, loss
        if it == 0 and after_first is not None:
            after_first()
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


@contextlib.contextmanager
def quiet_loggers(*names):
    """The frameworks' loggers at ERROR and warnings ignored in the block
    (their progress and advice lines would drown the tables)."""
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
