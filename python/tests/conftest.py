import os
import sys

# make test runs with PYTHONPATH=build/python; allow running pytest alone too.
_build = os.path.join(os.path.dirname(__file__), "..", "..", "build", "python")
if os.path.isdir(_build) and _build not in sys.path:
    sys.path.insert(0, os.path.abspath(_build))

# Under pytest -n N (pytest-xdist: make test and test-quick) each worker
# runs torch on its share of the cores (2 cores, 2 workers: one thread each),
# not on all of them: N workers of all the cores' threads each oversubscribe
# the cores, and OpenMP's threads spin waiting for each other (on 2 cores,
# two workers of two threads were slower than one process). A test must pass
# at any thread count, as users run any: peaks depend on it (per-thread
# buffers of CPU kernels), so a test compares a step with one measured in
# the same process, never with a number another thread count gave.
# The scripts and commands a test starts get the same count.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
if _workers > 1 and "OMP_NUM_THREADS" not in os.environ:
    import torch

    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    os.environ["OMP_NUM_THREADS"] = str(max(1, (_cores or 1) // _workers))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_configure(config):
    # make test-quick skips these (the edit loop): see the Makefile.
    config.addinivalue_line(
        "markers", "slow: 10 s or more on 2 busy cores (inductor compiles, whole training "
        "loops, model sweeps); skip with -m 'not slow'")
    # .ci/run runs these twice: on the machine's own ISA and with
    # ONEDNN_MAX_CPU_ISA=AVX2, since oneDNN picks other kernels (and other
    # memory) on a CPU with native bf16 (see Note [Lazy's fit and oneDNN's
    # bf16 scratch] in test_lazy_user_loop.py).
    config.addinivalue_line(
        "markers", "numerics: compares floating-point results (autocast, bf16, GradScaler, "
        "gradients equal to the full batch's) that depend on the CPU's kernels")
    # See Note [Which tests run on the second torch] (scripts/check_torch_wheel.sh).
    config.addinivalue_line(
        "markers", "torch_api: exercises where memfit meets torch (allocator, dispatch and meta "
        "kernels, dynamo, FSDP, checkpointing, the extension); run again on the second torch")


import pytest


@pytest.fixture(autouse=True, scope="module")
def _forget_compiled_code():
    """After each test module, dynamo's caches are reset when it was used:
    compiled code and guards kept from one module's torch.compile left
    120 B tracked during a later module's eager memfit.lazy step (seen
    after test_compile.py, test_lazy.py's strict probe-cache check). Each
    module then starts as a process that never compiled."""
    yield
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


@pytest.fixture
def quiet_and_collected():
    """A test whose frameworks warn freely (Lightning, transformers), and
    after which what it left alive is collected: the simulated device of a
    later test counts what an earlier one left."""
    import gc
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    gc.collect()


@pytest.fixture
def quiet_lightning(quiet_and_collected):
    """quiet_and_collected, with Lightning's loggers at ERROR for the test."""
    import logging

    names = ("lightning", "lightning.pytorch", "lightning.fabric")
    levels = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.ERROR)
    yield
    for n, level in levels.items():
        logging.getLogger(n).setLevel(level)
