"""memfit.doctor: each kind of memory mistake, made in a small
loop, is found at the user's line with the bytes it costs; the fixed loop
and a healthy loop get no finding; the doctor leaves no trace and does not
change what the loop computes; `python -m memfit doctor` runs a script."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import memfit
from memfit.diagnosis.script import parse
from memfit.testing.models import tiny_llama

THIS = os.path.realpath(__file__)
STEPS = 6
with open(THIS) as _f:
    _LINES = _f.read().splitlines()


def line_of(tag):
    """The line of this file that ends with `# <- tag`."""
    hits = [i + 1 for i, text in enumerate(_LINES) if text.rstrip().endswith(f"# <- {tag}")]
    assert len(hits) == 1, f"tag {tag!r} on lines {hits}"
    return hits[0]


def of_kind(d, kind):
    return [f for f in d.findings if f.kind == kind]


def assert_found(d, kind, tag):
    found = of_kind(d, kind)
    assert found, f"no {kind} finding in:\n{d.report()}"
    f = found[0]
    assert os.path.realpath(f.where.file) == THIS and f.where.line == line_of(tag), d.report()
    return f


def mlp(out=8):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(inplace=True), nn.Linear(64, out))


def batches(n=STEPS, batch=16, classes=8):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 32, generator=g), torch.randint(0, classes, (batch,), generator=g))
            for _ in range(n)]


class Residual(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        out += x
        return F.relu(out, inplace=True)


def test_healthy_resnet_training_with_a_scheduler_gets_no_finding():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                          Residual(8), Residual(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with memfit.doctor(model, opt) as d:
        sched = torch.optim.lr_scheduler.StepLR(opt, 2)  # wraps opt.step inside the block
        for _ in range(STEPS):
            x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            sched.step()
    assert d.findings == [], d.report()
    assert len(d.steps) == STEPS


def train(model, opt, data):
    """The usual training loop: no finding."""
    for x, y in data:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()


# -- healthy loops --------------------------------------------------------------


def test_healthy_training_loop_gets_no_finding():
    model = mlp()
    opt = torch.optim.Adam(model.parameters())
    with memfit.doctor(model, opt) as d:
        train(model, opt, batches())
    assert d.findings == [], d.report()
    assert len(d.steps) == STEPS and d.step_kind == "optimizer step"
    assert "no findings" in d.report()


def test_healthy_eval_loop_gets_no_finding():
    model = mlp().eval()
    with memfit.doctor(model) as d:
        correct = 0
        with torch.no_grad():
            for x, y in batches():
                pred = model(x)
                correct += (pred.argmax(1) == y).sum().item()
    assert d.findings == [], d.report()
    # A forward's step ends where the next begins; the last one after the
    # loop's last torch call (N forwards are N steps, not N - 1).
    assert len(d.steps) == STEPS and d.step_kind == "forward"


# -- memory growth, graphs and tensors kept across steps -----------------------


def test_outputs_kept_in_a_list_are_memory_growth_at_their_line():
    model = mlp().eval()
    outputs = []
    with memfit.doctor(model) as d, torch.no_grad():
        for x, _ in batches():
            outputs.append(model(x))  # <- growth
    f = assert_found(d, "memory_growth", "growth")
    assert f.bytes == 16 * 8 * 4  # one [16, 8] float32 output per step


def test_two_mistakes_in_one_loop_are_two_findings_each_with_its_bytes():
    # `total += loss` and `outputs.append(out)` are two findings, each at its
    # own line with its own bytes.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    total, outputs = 0, []
    with memfit.doctor(model, opt, trials=False) as d:
        for x, y in batches():
            opt.zero_grad()
            out = model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            opt.step()
            total += loss  # <- two: total
            outputs.append(out)  # <- two: outputs
    graph = assert_found(d, "graph_kept", "two: total")
    assert graph.bytes == 0  # backward freed what its graphs saved
    growth = assert_found(d, "memory_growth", "two: outputs")
    assert growth.bytes == 16 * 8 * 4  # one [16, 8] float32 output per step
    # Item 4: a [16, 8] output is no number: .item() would raise.
    assert growth.fix.startswith("keep a host copy without its graph: "
                                 "`outputs.append(out.detach().cpu())`"), growth.fix
    assert len(d.findings) == 2, d.report()


def test_a_scalar_kept_in_a_list_is_kept_as_a_number():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    with memfit.doctor(model, opt, trials=False) as d:
        for x, y in batches():
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss)  # <- scalar kept
    f = assert_found(d, "memory_growth", "scalar kept")
    assert f.fix == "keep the number: `losses.append(loss.item())`", f.fix


def test_n_forwards_are_n_steps():
    # Guards against what was: a forward-only loop of N forwards was counted as N - 1 steps.
    model = mlp().eval()
    with memfit.doctor(model) as d, torch.no_grad():
        for x, _ in batches():
            model(x)
    assert len(d.steps) == STEPS and d.step_kind == "forward"
    assert d.report().startswith(f"memfit doctor: {STEPS} steps observed")


def test_growth_fixed_by_keeping_numbers():
    model = mlp().eval()
    outputs = []
    with memfit.doctor(model) as d, torch.no_grad():
        for x, _ in batches():
            outputs.append(model(x).sum().item())
    assert d.findings == [], d.report()


def test_a_step_tensor_kept_in_a_list_points_at_the_line_that_made_it():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    with memfit.doctor(model, opt) as d:
        for x, y in batches():
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            seen.append(x * 2)  # <- kept batch
    f = assert_found(d, "memory_growth", "kept batch")
    assert f.bytes == 16 * 32 * 4


def test_accumulating_the_loss_tensor_keeps_every_graph():
    model = mlp().eval()
    with memfit.doctor(model) as d:
        total = 0
        for x, y in batches():
            loss = F.cross_entropy(model(x), y)
            total += loss  # <- total += loss
    f = assert_found(d, "graph_kept", "total += loss")
    assert f.bytes > 0 and ".item()" in f.fix
    assert f.measured_saving is not None and f.measured_saving > 0, f
    # The graph's growth is this finding's, not a second one.
    assert not of_kind(d, "memory_growth"), d.report()


def test_accumulating_loss_item_keeps_no_graph():
    model = mlp().eval()
    with memfit.doctor(model) as d:
        total = 0
        for x, y in batches():
            total += F.cross_entropy(model(x), y).item()
    assert not of_kind(d, "graph_kept") and not of_kind(d, "memory_growth"), d.report()


def test_accumulating_the_loss_in_training_is_found_though_backward_freed_its_tensors():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with memfit.doctor(model, opt) as d:
        running = 0
        for x, y in batches():
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            running += loss  # <- running += loss
    f = assert_found(d, "graph_kept", "running += loss")
    # Backward freed what the graphs saved: the nodes pile up, not tensors.
    assert f.bytes == 0 and "nodes" in f.seen


def test_an_rnn_state_carried_without_detach_keeps_every_graph():
    torch.manual_seed(0)
    rnn = nn.LSTM(16, 32, batch_first=True)
    with memfit.doctor(rnn) as d:
        state = None
        for _ in range(STEPS):
            out, state = rnn(torch.randn(4, 10, 16), state)  # <- hidden state
    f = assert_found(d, "graph_kept", "hidden state")
    assert f.bytes > 0 and ".detach()" in f.fix


def test_a_detached_rnn_state_keeps_no_graph():
    torch.manual_seed(0)
    rnn = nn.LSTM(16, 32, batch_first=True)
    with memfit.doctor(rnn) as d, torch.no_grad():
        state = None
        for _ in range(STEPS):
            out, state = rnn(torch.randn(4, 10, 16), state)
            state = tuple(s.detach() for s in state)
    assert d.findings == [], d.report()


def big_output_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(inplace=True), nn.Linear(64, 4096)).eval()


def test_an_output_alive_through_the_next_forward_is_tensors_kept():
    model = big_output_model()
    scores = []
    with memfit.doctor(model) as d, torch.no_grad():
        for x, _ in batches():
            out = model(x)  # <- logits
            scores.append(out.max().item())
    f = assert_found(d, "tensors_kept", "logits")
    assert f.bytes == 16 * 4096 * 4
    assert f.estimated_saving == 16 * 4096 * 4  # the next forward's peak falls by it


def test_inputs_made_before_the_forward_are_not_kept_tensors():
    # x of step k+1 is made before forward k+1 begins, so in step k: it is
    # the next step's, not a tensor kept from the last one.
    model = big_output_model()
    with memfit.doctor(model) as d, torch.inference_mode():
        for _ in range(STEPS):
            model(torch.randn(512, 32)).max().item()
    assert d.findings == [], d.report()


def test_deleting_the_output_fixes_tensors_kept():
    model = big_output_model()
    scores = []
    with memfit.doctor(model) as d, torch.no_grad():
        for x, _ in batches():
            out = model(x)
            scores.append(out.max().item())
            del out
    assert d.findings == [], d.report()


# -- autograd and gradients ----------------------------------------------------


def test_eval_without_no_grad_is_found_with_the_activations_it_saved():
    model = mlp().eval()
    with memfit.doctor(model) as d:
        correct = 0
        for x, y in batches():
            pred = model(x)  # <- eval forward
            correct += (pred.argmax(1) == y).sum().item()
    f = assert_found(d, "eval_with_grad", "eval forward")
    assert f.bytes > 0 and "no_grad" in f.fix
    # Re-run under no_grad: the bytes held for backward go.
    assert f.measured_saving is not None and f.measured_saving > 0, f
    assert abs(f.measured_saving - f.estimated_saving) <= 0.1 * f.estimated_saving


def test_a_validation_forward_inside_a_training_loop_is_found():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    val_x = torch.randn(16, 32)
    with memfit.doctor(model, opt) as d:
        for x, y in batches():
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            val = model(val_x).argmax(1)  # <- validation forward
    assert_found(d, "eval_with_grad", "validation forward")


def test_zero_grad_without_set_to_none_keeps_gradients():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with memfit.doctor(model, opt) as d:
        for x, y in batches():
            opt.zero_grad(set_to_none=False)  # <- set_to_none=False
            F.cross_entropy(model(x), y).backward()
            opt.step()
    f = assert_found(d, "grads_kept", "set_to_none=False")
    assert "set_to_none=True" in f.fix and f.bytes > 0


def test_model_zero_grad_after_the_step_keeps_no_gradients():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with memfit.doctor(model, opt) as d:
        for x, y in batches():
            F.cross_entropy(model(x), y).backward()
            opt.step()
            model.zero_grad()
    assert d.findings == [], d.report()


# -- tensors the step makes ------------------------------------------------------


def _mse_loss_takes_a_float64_target():
    """Whether this torch runs the loop below at all: torch 2.11's mse_loss
    refuses a float64 target for a float32 output in backward ("Found
    dtype Double but expected Float"), 2.13 promotes it."""
    out = torch.zeros(2, 1, requires_grad=True)
    try:
        F.mse_loss(out, torch.zeros(2, 1, dtype=torch.float64)).backward()
    except RuntimeError:
        return False
    return True


def test_a_float64_target_from_numpy_is_found_at_its_line():
    if not _mse_loss_takes_a_float64_target():
        pytest.skip("this torch's mse_loss refuses a float64 target: the user's loop fails itself")
    model = mlp(out=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    targets = [np.random.default_rng(i).standard_normal((16, 1)) for i in range(STEPS)]
    with memfit.doctor(model, opt) as d:
        for (x, _), t in zip(batches(), targets):
            opt.zero_grad()
            loss = F.mse_loss(model(x), torch.from_numpy(t))  # <- float64
            loss.backward()
            opt.step()
    f = assert_found(d, "float64", "float64")
    assert f.bytes == 16 * 8 and f.estimated_saving == 16 * 4


def test_a_float32_target_has_no_float64_finding():
    model = mlp(out=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    targets = [np.random.default_rng(i).standard_normal((16, 1)) for i in range(STEPS)]
    with memfit.doctor(model, opt) as d:
        for (x, _), t in zip(batches(), targets):
            opt.zero_grad()
            F.mse_loss(model(x), torch.from_numpy(t).float()).backward()
            opt.step()
    assert d.findings == [], d.report()


class Block(nn.Module):
    def __init__(self, in_place=False, used_later=False, saved_input=False):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(32, 256), nn.Linear(256, 4)
        self.in_place, self.used_later, self.saved_input = in_place, used_later, saved_input

    def forward(self, x):
        h = self.fc1(x)
        if self.saved_input:
            h = h.exp()  # exp saves its result: sigmoid_ would overwrite it
            a = torch.sigmoid(h)
        elif self.in_place:
            a = torch.relu_(h)
        else:
            a = torch.relu(h)  # <- relu
        out = self.fc2(a)
        return out + h.sum() if self.used_later else out


def eval_loop(model):
    with memfit.doctor(model) as d, torch.no_grad():
        for x, _ in batches():
            model(x).argmax(1).tolist()
    return d


def test_an_out_of_place_relu_whose_input_dies_is_not_in_place():
    d = eval_loop(Block().eval())
    f = assert_found(d, "not_in_place", "relu")
    assert f.bytes == 16 * 256 * 4
    assert f.estimated_saving == 16 * 256 * 4  # the relu's output was the peak
    assert "relu_" in f.fix


def test_relu_in_place_has_no_finding():
    assert eval_loop(Block(in_place=True).eval()).findings == []


def test_no_in_place_advice_where_the_input_is_used_later():
    d = eval_loop(Block(used_later=True).eval())
    assert not of_kind(d, "not_in_place"), d.report()


def test_no_in_place_advice_where_autograd_saved_the_input():
    model = Block(saved_input=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with memfit.doctor(model, opt) as d:
        for x, _ in batches():
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    assert not of_kind(d, "not_in_place"), d.report()


# -- copies to a device ---------------------------------------------------------


def test_blocking_copies_from_pageable_memory_report_the_bytes_copied():
    # The meta device stands in for a GPU here: a copy from host memory to
    # another device. The test below checks the fixed loop on a real GPU.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with memfit.doctor(model, opt) as d:
        for x, y in batches():
            opt.zero_grad()
            shadow = x.to("meta")  # <- copy
            F.cross_entropy(model(x), y).backward()
            opt.step()
    f = assert_found(d, "pageable_copy", "copy")
    assert f.bytes == 16 * 32 * 4 and "non_blocking=True" in f.fix


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pinned_non_blocking_copies_have_no_finding():
    model = mlp().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(x.pin_memory(), y.pin_memory()) for x, y in batches()]
    with memfit.doctor(model, opt) as d:
        for x, y in data:
            opt.zero_grad()
            x, y = x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
    assert not of_kind(d, "pageable_copy"), d.report()


# -- the doctor changes nothing --------------------------------------------------


def hooks_state(model):
    from torch.nn.modules import module as m
    from torch.optim import optimizer as o

    return (len(model._forward_pre_hooks), len(model._forward_hooks),
            len(m._global_forward_pre_hooks), len(m._global_forward_hooks),
            len(o._global_optimizer_pre_hooks), len(o._global_optimizer_post_hooks),
            torch.optim.Optimizer.__dict__["zero_grad"], nn.Module.__dict__["zero_grad"],
            torch._C._len_torch_function_stack(),
            torch._C._autograd._top_saved_tensors_default_hooks(False))


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.bn, self.drop, self.fc2 = (nn.Linear(32, 64), nn.BatchNorm1d(64),
                                                  nn.Dropout(0.3), nn.Linear(64, 8))

    def forward(self, x):
        return self.fc2(self.drop(F.relu(self.bn(self.fc1(x)), inplace=True)))


def zeroing_loop(model, opt):
    for x, y in batches():
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()


def test_the_loop_computes_the_same_with_and_without_the_doctor():
    # A model with BatchNorm and dropout; the trial (set_to_none) re-runs a
    # forward and a backward: parameters, buffers, RNG must end as without.
    ref = BNNet()
    ref_opt = torch.optim.Adam(ref.parameters())
    torch.manual_seed(5)
    zeroing_loop(ref, ref_opt)
    ref_rng = torch.random.get_rng_state()

    model = BNNet()
    opt = torch.optim.Adam(model.parameters())
    before = hooks_state(model)
    torch.manual_seed(5)
    with memfit.doctor(model, opt) as d:
        zeroing_loop(model, opt)
    assert of_kind(d, "grads_kept") and of_kind(d, "grads_kept")[0].measured_saving is not None
    assert hooks_state(model) == before
    assert torch.equal(torch.random.get_rng_state(), ref_rng)
    for (name, a), b in zip(model.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), name
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_everything_is_restored_when_the_loop_raises():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = hooks_state(model)
    with pytest.raises(KeyError):
        with memfit.doctor(model, opt):
            for i, (x, y) in enumerate(batches()):
                F.cross_entropy(model(x), y).backward()
                opt.step()
                if i == 2:
                    raise KeyError("the loop's own error")
    assert hooks_state(model) == before


def test_an_in_place_bug_still_raises_under_the_doctor():
    x = torch.randn(5, requires_grad=True)
    with memfit.doctor():
        y = x.sigmoid()
        y.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def test_max_steps_stops_the_loop():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    d = memfit.diagnosis.Doctor(model, opt, max_steps=3)
    before = hooks_state(model)
    ran = 0
    with d:
        for x, y in batches(10):
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            ran += 1
    assert ran == 2 and len(d.steps) == 3  # stopped inside the third opt.step()
    assert hooks_state(model) == before


# -- the command ------------------------------------------------------------------


def test_doctor_arguments_before_and_after_the_script():
    assert parse(["t.py", "--lr", "1", "--steps", "4"]) == ("t.py", ["--lr", "1"], 4, True, 600)
    assert parse(["--steps=2", "--no-trials", "t.py", "-h"]) == ("t.py", ["-h"], 2, False, 600)
    assert parse(["--steps", "3", "t.py", "--", "--steps", "9"]) == (
        "t.py", ["--steps", "9"], 3, True, 600)
    with pytest.raises(ValueError):
        parse(["--steps", "0", "t.py"])
    with pytest.raises(ValueError):
        parse(["--steps", "2"])


SCRIPT = '''
import sys
import torch
from torch import nn

model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, 10))
loss_fn = nn.CrossEntropyLoss()
model.eval()
test_loss = 0
for _ in range(int(sys.argv[1])):
    X, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    pred = model(X)
    test_loss += loss_fn(pred, y).item()
print("done", test_loss > 0)
'''


def test_python_m_memfit_doctor_runs_a_script_unchanged(tmp_path):
    script = tmp_path / "eval_loop.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-m", "memfit", "doctor", str(script), "100",
                          "--steps", "4"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "4 steps observed (a step: one forward" in out.stdout
    assert "eval_with_grad at eval_loop.py:12" in out.stdout, out.stdout
    assert "done" not in out.stdout  # stopped after 4 of its 100 steps
