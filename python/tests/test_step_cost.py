"""Strategy costs estimated from FLOPs counted on meta and bytes moved:
exact counts on a small model, labelled estimates, nothing left behind."""

import pytest
import torch

import memfit
from memfit.step_cost import count_step_flops, estimate_costs


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


FORWARD = 2 * 8 * 64 * 128 + 2 * 8 * 128 * 10
# weight gradients of both layers, and the input gradient of the second
# (the batch does not require grad)
BACKWARD = 2 * 8 * 64 * 128 + 2 * 2 * 8 * 128 * 10


def test_step_flops_are_counted_exactly_on_meta_and_leave_the_model_as_it_was():
    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    f = count_step_flops(model, x, y)
    assert (f.forward, f.backward) == (FORWARD, BACKWARD)
    assert f.blocks == {"0": 2 * 8 * 64 * 128, "1": 0, "2": 2 * 8 * 128 * 10}
    assert f.trainable_bytes == f.parameter_bytes == 4 * (64 * 128 + 128 + 128 * 10 + 10)
    assert all(torch.equal(p, b) and p.grad is None for p, b in zip(model.parameters(), before))


def test_strategy_costs_are_labelled_estimates_from_flops_and_bytes():
    model = mlp()
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    rows = estimate_costs(model, x, y, device_flops=1e6, link_bytes_per_s=1e6)
    by = {r.strategy: r for r in rows}
    plain = (FORWARD + BACKWARD) / 1e6
    assert by["plain step"].relative_time == 1.0
    every = by["recompute every block (3)"]
    assert every.extra_flops == FORWARD
    assert every.relative_time == pytest.approx((plain + FORWARD / 1e6) / plain)
    host = by["optimizer state on the host"]
    assert host.bytes_moved == 2 * 4 * (64 * 128 + 128 + 128 * 10 + 10)
    assert all(r.basis.startswith("estimate: FLOPs at 1e-06 TFLOP/s") for r in rows)


def test_costs_of_a_model_on_the_meta_device():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 10))
    x = torch.empty(8, 64, device="meta")
    f = count_step_flops(model, x, torch.empty(8, dtype=torch.long, device="meta"))
    assert (f.forward, f.backward) == (FORWARD, BACKWARD)
    assert all(p.is_meta and p.grad is None for p in model.parameters())


def test_bad_rates_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"^\[estimate_costs\] device_flops and link_bytes_per_s"):
        estimate_costs(mlp(), torch.randn(2, 64), torch.randint(0, 10, (2,)), device_flops=0)


def test_estimate_costs_is_exported():
    assert memfit.estimate_costs is estimate_costs
