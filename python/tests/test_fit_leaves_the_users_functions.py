"""find_batch_size runs the user's step function, a wrapper they set on the
optimizer's step and the optimizer's step pre-hooks in every rehearsal (18
in one search); what those keep (a nonlocal count, a global one, a list of
logged values, a deque of recent ones, a wrapper's attribute) comes back
as it was, and a tensor learning rate stays the very tensor the user's
scheduler fills. See Note
[What the user's functions keep] (callable_state.py). The truth: a twin
that never met memfit, and plain steps at the answer."""

import collections

import pytest
import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_pre_hook

import memfit
from memfit.testing.truth import plain_steps_run

BUDGET = 1 << 20
LOGGED = []  # a global the step appends to
STEPS = 0  # a global the step counts in


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def _counted(step):
    calls = 0

    def wrapper(*args, **kwargs):
        nonlocal calls
        calls += 1
        wrapper.calls += 1
        return step(*args, **kwargs)
    wrapper.calls = 0
    wrapper.count = lambda: calls
    return wrapper


def _stepper():
    seen, recent = [], collections.deque(maxlen=4)

    def step(model, batch):
        global STEPS
        STEPS += 1
        x, y = batch
        loss = F.cross_entropy(model(x), y)
        seen.append(loss.detach())
        recent.append(len(seen))
        LOGGED.append(len(seen))
        return loss
    step.recent = recent
    return step, seen


def _setup():
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=torch.tensor(1e-3))
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    opt.step = _counted(opt.step)
    pre = []
    opt.register_step_pre_hook(lambda *_: pre.append(1))
    step, seen = _stepper()
    return model, opt, sched, pre, step, seen


def _state(opt, sched, pre, seen, step):
    return (opt.step.count(), opt.step.calls, len(pre), len(seen), list(step.recent), STEPS,
            len(LOGGED), sched.last_epoch, float(opt.param_groups[0]["lr"]))


def _train(model, opt, sched, step, batch):
    step(model, batch).backward()
    opt.step()
    opt.zero_grad()
    sched.step()


# The wrapper is set after the scheduler, which warns that it wraps step no more.
@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_the_users_functions_keep_what_they_kept_and_the_answer_runs():
    global STEPS
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    model, opt, sched, pre, step, seen = _setup()
    lr = opt.param_groups[0]["lr"]
    twin = _setup()
    glob = []
    handle = register_optimizer_step_pre_hook(lambda *_: glob.append(1))
    try:
        before = _state(opt, sched, pre, seen, step), len(glob)
        STEPS, LOGGED[:] = 0, []
        fit = memfit.find_batch_size(model, (x, y), optimizer=opt, budget=BUDGET, step=step)
        assert (_state(opt, sched, pre, seen, step), len(glob)) == before
    finally:
        handle.remove()
    assert opt.param_groups[0]["lr"] is lr  # the tensor the scheduler fills
    for m, o, s, _, st, _ in ((model, opt, sched, pre, step, seen), twin):
        _train(m, o, s, st, (x, y))
    assert float(lr) == float(twin[1].param_groups[0]["lr"]) == pytest.approx(5e-4)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin[0].parameters()))

    def made():
        model, opt, sched, _, step, _ = _setup()
        return model, opt, sched, step

    def steps(model, opt, sched, step):
        b = fit.max_batch
        _train(model, opt, sched, step, (torch.randn(b, 32), torch.randint(0, 10, (b,))))
    assert plain_steps_run(BUDGET, made, steps)  # it adds what is alive beside


@pytest.mark.parametrize("mode", ["cpu", "meta"])
def test_the_hooks_on_the_model_keep_what_they_kept(mode):
    model = _model()
    calls = collections.Counter()
    means = []

    def logged(module, inputs, output):
        calls["forward"] += 1
        means.append(output.detach().mean())
    model[0].register_forward_hook(logged)
    model[2].register_forward_pre_hook(lambda *_: calls.update(["pre"]))
    model[2].register_full_backward_hook(lambda *_: calls.update(["backward"]))
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda *_: calls.update(["global"]))
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    try:
        memfit.find_batch_size(model, x, y, optimizer=torch.optim.Adam(model.parameters()),
                               budget=BUDGET, mode=mode)
    finally:
        handle.remove()
    assert not calls and not means
    F.cross_entropy(model(x), y).backward()  # the hooks still run in the user's step
    assert dict(calls) == {"forward": 1, "pre": 1, "backward": 1} and len(means) == 1
