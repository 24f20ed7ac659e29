"""Strategy costs estimated from FLOPs counted on meta and bytes moved:
exact counts on a small model, labelled estimates, nothing left behind."""

import pytest
import torch

import memfit
from memfit.plan.cost import count_step_flops, estimate_costs

pytestmark = pytest.mark.torch_api  # see python/tests/conftest.py


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


def reference_flops(model, x, y=None, loss_fn=None):
    """The counts as torch's FlopCounterMode (with its module tracker) makes
    them: (forward, backward, forward of each named submodule path)."""
    from torch.utils.flop_counter import FlopCounterMode

    from memfit.plan.cost import _count_on_meta

    fwd, bwd = FlopCounterMode(display=False), FlopCounterMode(display=False)
    _count_on_meta(model, x, y, loss_fn, fwd, bwd)
    root = type(model).__name__
    per = {k[len(root) + 1:]: sum(v.values()) for k, v in fwd.get_flop_counts().items()
           if k.startswith(root + ".")}
    return fwd.get_total_flops(), bwd.get_total_flops(), per


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 16, 3, stride=2), torch.nn.ReLU())
        self.head = torch.nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        return self.head(self.blocks(x).flatten(1))


def tiny_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(num_hidden_layers=3, hidden_size=128, intermediate_size=320,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=500,
                                   max_position_embeddings=64, use_cache=False)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    ids = torch.zeros(2, 64, dtype=torch.long, device="meta")
    return model, {"input_ids": ids, "labels": ids}, None, lambda o: o.loss


@pytest.mark.parametrize("case", ["mlp", "conv", "llama", "encoder"])
def test_step_flops_equal_torchs_flop_counter(case):
    # count_step_flops uses its own dispatch mode (no module tracker): the
    # totals and each block's forward must be FlopCounterMode's.
    if case == "mlp":
        model, x, y, lf = mlp(), torch.randn(8, 64), torch.randint(0, 10, (8,)), None
    elif case == "conv":
        model, x, y, lf = ConvNet(), torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,)), None
    elif case == "llama":
        model, x, y, lf = tiny_llama()
    else:
        layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
        x, y, lf = torch.randn(2, 16, 64), None, lambda out: out.sum()
    f = count_step_flops(model, x, y, lf)
    forward, backward, per = reference_flops(model, x, y, lf)
    assert (f.forward, f.backward) == (forward, backward) and forward > 0
    assert f.blocks and f.blocks == {p: per.get(p, 0) for p in f.blocks}
