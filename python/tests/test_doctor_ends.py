"""The doctor on scripts that end badly: an OOM reported with its line, phase,
what was alive and the fix; lazy tensors under it; a script that swallows
StopRun, never steps, is interrupted or calls os._exit; bad arguments
refused in one line."""

import gc
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import memfit

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


def doctor_cli(tmp_path, body, *args, timeout=240, warm_dynamo=False):
    """`python -m memfit doctor *args script.py`; with `warm_dynamo`, the
    same command run as runpy runs -m, after importing torch._dynamo."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    head = [sys.executable, "-m", "memfit"]
    if warm_dynamo:
        head = [sys.executable, "-c", "import runpy, torch._dynamo; "
                "runpy.run_module('memfit', run_name='__main__', alter_sys=True)"]
    return subprocess.run([*head, "doctor", *args, str(script)],
                          capture_output=True, text=True, env=ENV, cwd=tmp_path,
                          timeout=timeout)


ADAM_OOM = """
    import torch, torch.nn as nn, memfit
    with memfit.simulated_device("40MiB"):
        m = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))  # 2M params
        opt = torch.optim.Adam(m.parameters())
        for i in range(3):
            x = torch.randn(8, 1024)
            loss = nn.functional.mse_loss(m(x), torch.zeros(8, 1024))
            loss.backward()
            opt.step()
            opt.zero_grad()
"""


def test_a_script_that_dies_of_an_oom_in_adams_step_gets_the_oom_reported(tmp_path):
    out = doctor_cli(tmp_path, ADAM_OOM, "--steps", "2")
    assert out.returncode == 1
    report = out.stdout
    assert "the loop ran out of memory at script.py:10: see finding 1" in report, report
    assert "Use a smaller batch" not in report  # the device's own message explains too
    assert "1. out_of_memory at script.py:10" in report
    seen = next(line for line in report.splitlines() if line.lstrip().startswith("seen:"))
    assert "in the optimizer step of step 1" in seen
    # 2M float32 parameters: 8 MiB each of weights and gradients alive.
    assert "parameters 8.01 MiB" in seen and "gradients 8.01 MiB" in seen
    fix = next(line for line in report.splitlines() if line.lstrip().startswith("fix:"))
    assert "A smaller batch cannot help" in fix and "optimizer's state on the host" in fix


def test_the_oom_in_adams_step_names_what_fills_the_device():
    # Item 1: the simulated device's own message.
    gc.collect()  # what earlier tests left alive would count on the device
    with memfit.simulated_device("40MiB"):
        m = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))
        opt = torch.optim.Adam(m.parameters())
        nn.functional.mse_loss(m(torch.randn(8, 1024)), torch.zeros(8, 1024)).backward()
        with pytest.raises(torch.cuda.OutOfMemoryError) as e:
            opt.step()
    msg = str(e.value)
    # 2M float32 parameters: 8 MiB each of weights and gradients, twice that
    # of Adam's state made so far, largest first.
    assert msg.startswith("CUDA out of memory. [simulated_device] ran out in the optimizer "
                          "step, with optimizer state 16.02 MiB, parameters 8.01 MiB, "
                          "gradients 8.01 MiB"), msg
    assert "A smaller batch cannot help" in msg and "Use a smaller batch" not in msg
    assert "Tried to allocate" in msg and "budget 40.00 MiB" in msg
    assert "\n" not in msg


def test_an_oom_in_the_forward_names_the_activations():
    gc.collect()
    with memfit.simulated_device("6MiB"):
        m = nn.Sequential(nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 64))
        with pytest.raises(torch.cuda.OutOfMemoryError) as e:
            m(torch.randn(512, 64))
    msg = str(e.value)
    del e, m
    assert msg.startswith("CUDA out of memory. [simulated_device] ran out in the forward, with "
                          "parameters 2.02 MiB, activations"), msg
    assert "The activations saved for the backward are the excess" in msg
    assert "Use a smaller batch" not in msg


def test_an_oom_in_an_evaluation_forward_names_what_its_ops_hold():
    # Under no_grad nothing is saved for a backward, and no gradient will
    # sit beside the weights: 2.02 MiB of them in 6 MiB are not the model
    # alone exceeding the device (they were, counted twice), and the
    # activations are not "saved for the backward".
    gc.collect()
    with memfit.simulated_device("6MiB"):
        m = nn.Sequential(nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 64))
        with torch.no_grad(), pytest.raises(torch.cuda.OutOfMemoryError) as e:
            m(torch.randn(512, 64))
    msg = str(e.value)
    del e, m
    assert msg.startswith("CUDA out of memory. [simulated_device] ran out in the forward, with "
                          "parameters 2.02 MiB, temporaries"), msg
    assert "What the ops hold while they run is the excess" in msg
    assert "saved for the backward" not in msg and "cannot help" not in msg


def test_an_oom_in_the_forward_inside_an_optimizer_closure_is_the_forwards():
    # Lightning steps as optimizer.step(closure), the forward
    # and backward inside the closure; the forward's OOM is not the step's.
    gc.collect()
    with memfit.simulated_device("6MiB"):
        m = nn.Sequential(nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 64))
        opt = torch.optim.SGD(m.parameters(), lr=0.1)

        def closure():
            loss = m(torch.randn(512, 64)).square().mean()
            loss.backward()
            return loss

        with pytest.raises(torch.cuda.OutOfMemoryError) as e:
            opt.step(closure)
    msg = str(e.value)
    del e, m, opt
    assert msg.startswith("CUDA out of memory. [simulated_device] ran out in the forward, with "
                          "parameters 2.02 MiB, activations"), msg
    assert "A smaller batch cannot help" not in msg


CLOSURE_OOM = """
    import torch, torch.nn as nn, memfit
    with memfit.simulated_device("6MiB"):
        m = nn.Sequential(nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 64))
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for b in (8, 8, 512):
            def closure():
                opt.zero_grad()
                loss = m(torch.randn(b, 64)).square().mean()
                loss.backward()
                return loss
            opt.step(closure)
"""


def test_the_doctor_reports_a_forward_oom_inside_a_closure_as_the_forwards(tmp_path):
    out = doctor_cli(tmp_path, CLOSURE_OOM, "--steps", "3")
    report = out.stdout
    seen = next(line for line in report.splitlines() if line.lstrip().startswith("seen:"))
    assert "in the forward of step" in seen, report
    fix = next(line for line in report.splitlines() if line.lstrip().startswith("fix:"))
    assert "A smaller batch cannot help" not in fix, report


def test_lazy_inside_the_doctor_runs(tmp_path):  # C1
    m = nn.Linear(16, 4)
    x = memfit.lazy(torch.randn(8, 3))
    assert memfit._memfit.allocation_id(x) is None
    with memfit.doctor(m) as d:
        x, y = memfit.lazy(torch.randn(64, 16), torch.randint(0, 4, (64,)))
        loss = nn.functional.cross_entropy(m(x), y)
        loss.backward()
    assert "steps observed" in d.report()
    out = doctor_cli(tmp_path, """
        import torch, torch.nn as nn, memfit
        m = nn.Linear(16, 4)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(3):
            x, y = memfit.lazy(torch.randn(64, 16), torch.randint(0, 4, (64,)))
            nn.functional.cross_entropy(m(x), y).backward()
            opt.step(); opt.zero_grad()
    """, "--steps", "2")
    assert out.returncode == 0, out.stderr
    assert "2 steps observed" in out.stdout


@pytest.mark.slow
def test_a_loop_that_swallows_stoprun_still_ends(tmp_path):  # C2
    # The first optimizer imports torch._dynamo (5-10 s on busy cores), and
    # the time limit counts from when the script starts: warmed before it,
    # the loop swallows its first StopRun 10 ms into the limit, so a 2 s
    # limit still ends the loop and not the set-up. "2 steps observed" says
    # the loop was entered and stopped by --steps before the limit fired.
    out = doctor_cli(tmp_path, """
        import torch, torch.nn as nn
        m = nn.Linear(4, 2)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        while True:
            try:
                m(torch.randn(8, 4)).sum().backward()
                opt.step(); opt.zero_grad()
            except BaseException:
                pass
    """, "--steps", "2", "--time-limit", "2", warm_dynamo=True)
    assert out.returncode in (0, 1)
    assert "memfit doctor: 2 steps observed" in out.stdout, out.stdout + out.stderr
    assert "--time-limit 2 s" in out.stderr


@pytest.mark.slow
def test_a_script_that_never_steps_ends_at_the_time_limit(tmp_path):  # C2
    out = doctor_cli(tmp_path, """
        import time
        while True:
            try:
                time.sleep(0.05)
            except BaseException:
                pass
    """, "--time-limit", "1")  # the script imports nothing slow: 1 s is all sleeping
    assert out.returncode == 1
    assert "memfit doctor: 0 steps observed" in out.stdout
    assert "--time-limit 1 s" in out.stderr


def test_keyboard_interrupt_still_prints_the_report(tmp_path):  # C3
    out = doctor_cli(tmp_path, """
        import torch, torch.nn as nn
        m = nn.Linear(4, 2)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for i in range(3):
            m(torch.randn(8, 4)).sum().backward()
            opt.step(); opt.zero_grad()
        raise KeyboardInterrupt
    """, "--steps", "10")
    assert out.returncode == 1
    assert "memfit doctor: 3 steps observed" in out.stdout
    assert "KeyboardInterrupt" in out.stderr


def test_os_exit_leaves_the_report_of_what_was_seen(tmp_path):  # C3
    out = doctor_cli(tmp_path, """
        import os, torch, torch.nn as nn
        m = nn.Linear(4, 2)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for i in range(3):
            m(torch.randn(8, 4)).sum().backward()
            opt.step(); opt.zero_grad()
        os._exit(3)
    """, "--steps", "10")
    assert out.returncode == 3
    assert "memfit doctor: 3 steps observed" in out.stdout
    assert "os._exit(3)" in out.stderr


def test_doctor_help_exits_0(tmp_path):
    out = subprocess.run([sys.executable, "-m", "memfit", "doctor", "--help"],
                         capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: memfit doctor")


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(max_steps=-1), r"^\[doctor\] max_steps must be an int >= 1, got int -1$"),  # D5
    (dict(max_steps="3"), r"^\[doctor\] max_steps must be an int >= 1, got str '3'$"),
    (dict(model="abc"), r"^\[doctor\] model must be the torch.nn.Module"),
    (dict(optimizer=5), r"^\[doctor\] optimizer must be the torch.optim optimizer"),  # D6
    (dict(trials="no"), r"^\[doctor\] trials must be True or False, got 'no'$"),
])
def test_doctor_refuses_what_it_cannot_watch(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        memfit.Doctor(**kwargs)


def test_doctor_refuses_an_optimizer_over_another_model():  # D6
    m, other = nn.Linear(4, 2), nn.Linear(4, 2)
    with pytest.raises(ValueError, match=r"^\[doctor\] the SGD optimizer holds none of the "
                                         r"model's 2 trainable parameters"):
        memfit.doctor(m, torch.optim.SGD(other.parameters(), lr=0.1))
