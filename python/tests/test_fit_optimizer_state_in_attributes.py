"""An optimizer of the user's that keeps its state outside
optimizer.state (momentum buffers in a list it makes at its first step, a
step count in an int): the rehearsals leave the optimizer as it was, and
a warm one's buffers are counted as the state the step starts with. The
truth is plain steps of the user's loop on a simulated device. See Note
[An optimizer's own attributes] (user_state.py)."""

import gc

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit.testing.truth import plain_steps_run

BUDGET = 12 << 20


class AttributeMomentum(torch.optim.Optimizer):
    def __init__(self, params, lr=0.1):
        super().__init__(params, dict(lr=lr))
        self.buffers = None  # made at the first step, as optimizer.state would be
        self.steps = 0

    @torch.no_grad()
    def step(self, closure=None):
        params = [p for g in self.param_groups for p in g["params"]]
        if self.buffers is None:
            self.buffers = [torch.zeros_like(p) for p in params]
        self.steps += 1
        for p, b in zip(params, self.buffers):
            b.mul_(0.9).add_(p.grad)
            p.add_(b, alpha=-self.param_groups[0]["lr"])


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 10))


def _step(model, opt, b):
    x, y = torch.randn(b, 256), torch.randint(0, 10, (b,))
    F.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()


def _runs(b, warm):
    def build():
        model = _mlp()
        opt = AttributeMomentum(model.parameters())
        if warm:
            _step(model, opt, 8)
        return model, opt, b
    gc.collect()
    return plain_steps_run(BUDGET, build, _step, steps=3)


@pytest.mark.parametrize("warm,mode", [(False, "cpu"), (False, "meta"), (True, "cpu")])
def test_an_optimizers_own_buffers_are_put_back_and_counted(warm, mode):
    torch.manual_seed(0)
    model = _mlp()
    opt = AttributeMomentum(model.parameters())
    if warm:
        _step(model, opt, 8)
    held = None if opt.buffers is None else [(b, b.clone()) for b in opt.buffers]
    x, y = torch.randn(8, 256), torch.randint(0, 10, (8,))
    fit = memfit.find_batch_size(model, x, y, optimizer=opt, budget=BUDGET, mode=mode)
    assert opt.steps == (1 if warm else 0)
    if held is None:
        assert opt.buffers is None
    else:
        assert all(a is b and torch.equal(b, value) for a, (b, value) in zip(opt.buffers, held))
    assert _runs(fit.max_batch, warm), f"batch {fit.max_batch} ran out of memory"
    assert not _runs(int(fit.max_batch * 1.05) + 1, warm)


class CountingSGD(torch.optim.SGD):
    """Keeps a count of its own in its state, under a key that is not a
    parameter (torch's state_dict carries such entries too)."""

    @torch.no_grad()
    def step(self, closure=None):
        self.state["global_step"] = self.state.get("global_step", 0) + 1
        return super().step(closure)


@pytest.mark.parametrize("warm", [False, True])
def test_a_state_entry_of_the_optimizers_own_is_taken_and_put_back(warm):
    def made():
        model = _mlp()
        opt = CountingSGD(model.parameters(), lr=0.1, momentum=0.9)
        if warm:
            _step(model, opt, 8)
        return model, opt

    torch.manual_seed(0)
    model, opt = made()
    x, y = torch.randn(8, 256), torch.randint(0, 10, (8,))
    fit = memfit.find_batch_size(model, x, y, optimizer=opt, budget=BUDGET)
    assert opt.state.get("global_step") == (1 if warm else None)
    gc.collect()
    assert plain_steps_run(BUDGET, lambda: (*made(), fit.max_batch), _step, steps=3)
    assert not plain_steps_run(BUDGET, lambda: (*made(), int(fit.max_batch * 1.05) + 1),
                               _step, steps=3)


class Lookahead(torch.optim.Optimizer):
    """timm's Lookahead, abridged: the base optimizer in an attribute, its
    param_groups shared, slow weights in a state of its own."""

    def __init__(self, base, alpha=0.5):
        from collections import OrderedDict, defaultdict
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        self._base_optimizer = base
        self.param_groups = base.param_groups
        self.defaults = base.defaults
        self.state = defaultdict(dict)
        self.alpha = alpha

    @torch.no_grad()
    def step(self, closure=None):
        loss = self._base_optimizer.step(closure)
        for p in (p for g in self.param_groups for p in g["params"]):
            slow = self.state[p].setdefault("slow", p.detach().clone())
            slow.add_(p - slow, alpha=self.alpha)
            p.copy_(slow)
        return loss


@pytest.mark.parametrize("warm", [False, True])
def test_a_wrapped_base_optimizers_state_is_counted_and_put_back(warm):
    def made():
        model = _mlp()
        opt = Lookahead(torch.optim.Adam(model.parameters()))
        if warm:
            _step(model, opt, 8)
        return model, opt

    torch.manual_seed(0)
    model, opt = made()
    held = [(s["exp_avg"], s["exp_avg"].clone()) for s in opt._base_optimizer.state.values()]
    x, y = torch.randn(8, 256), torch.randint(0, 10, (8,))
    fit = memfit.find_batch_size(model, x, y, optimizer=opt, budget=BUDGET)
    now = [s["exp_avg"] for s in opt._base_optimizer.state.values()]
    assert len(now) == len(held) and all(a is b and torch.equal(a, v)
                                         for a, (b, v) in zip(now, held))
    gc.collect()
    assert plain_steps_run(BUDGET, lambda: (*made(), fit.max_batch), _step, steps=3)
    assert not plain_steps_run(BUDGET, lambda: (*made(), int(fit.max_batch * 1.05) + 1),
                               _step, steps=3)
