import copy

import pytest
import torch

import memfit

pytestmark = pytest.mark.torch_api  # see python/tests/conftest.py


def net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))


def batches(n=6):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)) for _ in range(n)]


def train(model, opt, data, scheduler=None, halve_at=None):
    for i, (x, y) in enumerate(data):
        if i == halve_at:  # weights changed on the device between steps
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(0.5)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if scheduler:
            scheduler.step()
    return [p.detach().clone() for p in model.parameters()]


def param_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.Adam(ps, lr=1e-2),
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9),
])
def test_equals_the_wrapped_optimizer_bit_for_bit(make):
    # The host step is the same arithmetic on the CPU: equal bit for bit, an
    # LR schedule, a frozen parameter (no gradient) and weights changed on
    # the device between steps included.
    plain_m, off_m = net(), net()
    for m in (plain_m, off_m):
        m[2].bias.requires_grad_(False)
    plain = make(plain_m.parameters())
    off = memfit.offload(make(off_m.parameters()))
    want = train(plain_m, plain, batches(), torch.optim.lr_scheduler.StepLR(plain, 2, 0.5), 3)
    got = train(off_m, off, batches(), torch.optim.lr_scheduler.StepLR(off, 2, 0.5), 3)
    for a, b in zip(want, got):
        assert torch.equal(a, b)
    assert torch.equal(off_m[2].bias, net()[2].bias * 0.5)
    assert off.param_groups[0]["lr"] == plain.param_groups[0]["lr"] < 1e-2


def test_state_gathered_before_moves_to_the_host_and_back_out():
    data = batches()
    plain_m, off_m = net(), net()
    plain = torch.optim.Adam(plain_m.parameters(), lr=1e-2)
    want = train(plain_m, plain, data)
    opt = torch.optim.Adam(off_m.parameters(), lr=1e-2)
    train(off_m, opt, data[:2])
    off = memfit.offload(opt)  # two steps of state move to the host
    got = train(off_m, off, data[2:])
    for a, b in zip(want, got):
        assert torch.equal(a, b)
    # Its state_dict is Adam's: a plain Adam takes it and goes on the same.
    twin = copy.deepcopy(off_m)
    again = torch.optim.Adam(twin.parameters(), lr=1e-2)
    # A copy, as a checkpoint on disk is: torch 2.x's load_state_dict keeps
    # the very state tensors it is given when dtype and device match, so
    # two optimizers loaded from one live state_dict would share them.
    again.load_state_dict(copy.deepcopy(off.state_dict()))
    more = batches(8)[6:]
    for a, b in zip(train(twin, again, more), train(off_m, off, more)):
        assert torch.equal(a, b)


def wide():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU())
                                 for _ in range(4)])


def wide_batch(n):
    g = torch.Generator().manual_seed(2)
    return torch.randn(n, 256, generator=g), torch.randn(n, 256, generator=g)


def test_the_step_allocates_nothing_on_the_simulated_device():
    # What the step allocates on the device is torch's own bookkeeping (a
    # record_function handle per step in torch 1.13), not state.
    model = wide()
    x, y = wide_batch(4)
    params = param_bytes(model)
    for offloaded in (True, False):
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        opt = memfit.offload(opt) if offloaded else opt
        torch.nn.functional.mse_loss(model(x), y).backward()
        with memfit.track() as t:
            opt.step()
            live = t.live_bytes
        opt.zero_grad(set_to_none=True)
        if offloaded:
            assert t.peak_bytes < 1024 and live == 0
            # Host: parameter copies, gradient buffers, exp_avg, exp_avg_sq
            # and Adam's step count (a float32 scalar per parameter).
            assert opt.host_bytes() == 4 * params + 4 * len(list(model.parameters()))
        else:
            assert live >= 2 * params


def test_profile_shows_no_state_and_a_budget_adam_overflows_is_enough():
    model = wide()
    x, y = wide_batch(8)
    adam = memfit.profile(model, x, y, optimizer="adam")
    off = memfit.profile(model, x, y, optimizer="adam-offload")
    wrapped = memfit.profile(model, x, y,
                             optimizer=memfit.offload(torch.optim.Adam(model.parameters())))
    assert off.peak_bytes == wrapped.peak_bytes
    assert adam.categories_at_peak["optimizer_state"] > 0
    assert off.categories_at_peak["optimizer_state"] == 0
    assert off.peak_bytes <= adam.peak_bytes - 2 * param_bytes(model)
    assert all(p["delta_bytes"] == 0 for p in off.phases if p["name"] == "optimizer_step")
    assert "on the host" in off.notes[-1] and not adam.notes
    assert wrapped.optimizer == "Adam-offload"
    assert all("on the host" in p["note"] for p in wrapped.phases if p["name"] == "optimizer_step")

    budget = (off.peak_bytes + adam.peak_bytes) // 2

    def losses(offloaded):
        with memfit.simulated_device(budget):
            m = wide()
            opt = torch.optim.Adam(m.parameters(), lr=1e-3)
            opt = memfit.offload(opt) if offloaded else opt
            t = memfit.Trainer(m, opt, torch.nn.MSELoss(), split=False)
            return [t.step(x, y).loss for _ in range(3)]

    def plain_losses():  # its tracked state dies with it: not in the budget
        m = wide()
        t = memfit.Trainer(m, torch.optim.Adam(m.parameters(), lr=1e-3), torch.nn.MSELoss())
        return [t.step(x, y).loss for _ in range(3)]

    assert losses(True) == plain_losses()
    with pytest.raises(torch.cuda.OutOfMemoryError):
        losses(False)


def test_advise_plans_the_host_state_only_when_nothing_on_the_device_fits():
    # Parameters dominate (batch 2): checkpointing saves little, the state
    # on the host saves two copies of the parameters.
    model = wide()
    x, y = wide_batch(2)
    free = memfit.advise(model, x, y, repeats=1)
    host = next(r for r in free.rows if r.strategy.host_state)
    assert host.exact and host.kind == "optimizer"
    assert host.saving_bytes >= 2 * param_bytes(model)
    every = next(r for r in free.rows if r.name.startswith("checkpoint every"))
    assert host.peak_bytes < every.peak_bytes
    budget = (host.peak_bytes + every.peak_bytes) // 2
    advice = memfit.advise(model, x, y, budget=budget, repeats=1)
    assert advice.plan.found and advice.plan.exact
    assert advice.plan.strategy.host_state and advice.plan.optimizer == "adam-offload"
    # Applied: the plan's optimizer trains the batch under the budget.
    with memfit.simulated_device(budget):
        m = wide()
    opt = advice.optimizer_for(torch.optim.Adam(m.parameters(), lr=1e-3))
    assert isinstance(opt, memfit.OffloadedOptimizer)
    t = memfit.Trainer(m, opt, torch.nn.MSELoss(), budget=budget, split=False)
    with advice.apply(m):
        assert all(t.step(x, y).ooms_recovered == 0 for _ in range(2))
    # A budget checkpointing meets: the plan stays on the device.
    roomy = memfit.advise(model, x, y, budget=every.peak_bytes, repeats=1)
    assert roomy.plan.found and not roomy.plan.strategy.host_state
    adam = torch.optim.Adam(m.parameters())
    assert roomy.optimizer_for(adam) is adam


def test_profiling_with_the_offloaded_optimizer_leaves_training_as_it_was():
    data = batches()
    plain_m, off_m = net(), net()
    plain = torch.optim.Adam(plain_m.parameters(), lr=1e-2)
    off = memfit.offload(torch.optim.Adam(off_m.parameters(), lr=1e-2))
    want = train(plain_m, plain, data)
    train(off_m, off, data[:3])
    memfit.profile(off_m, *data[0], optimizer=off)  # trains, then restores
    for a, b in zip(want, train(off_m, off, data[3:])):
        assert torch.equal(a, b)


def test_bad_input_is_explained():
    opt = memfit.offload(torch.optim.Adam(net().parameters()))
    with pytest.raises(ValueError, match="already offloaded"):
        memfit.offload(opt)
    with pytest.raises(TypeError, match="torch.optim optimizer"):
        memfit.offload(net())
