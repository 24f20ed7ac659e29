"""FLOPs counted by the core while a step is recorded (See Note [FLOPs
counted while a step is recorded]): torch's formulas, the last iteration's
forward, loss and backward only, each block's forward apart; what the core
has no formula for is left to torch's counter; advise on meta counts no
step twice."""

import pytest
import torch

import memfit
from memfit._step.step_flops import counting_flops
from memfit.plan.cost import count_step_flops

pytestmark = pytest.mark.torch_api  # see python/tests/conftest.py

FORWARD = 2 * 8 * 64 * 128 + 2 * 8 * 128 * 10
# weight gradients of both layers, and the input gradient of the second
# (the batch does not require grad)
BACKWARD = 2 * 8 * 64 * 128 + 2 * 2 * 8 * 128 * 10


def mlp(device="cpu"):
    torch.manual_seed(0)
    with torch.device(device):
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 10))


@pytest.mark.parametrize("mode", ["meta", "cpu"])
def test_a_recorded_step_counts_the_closed_form_of_its_last_iteration(mode):
    model = mlp()
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    # Two iterations and Adam's step: neither doubles the count nor adds to it.
    with counting_flops(["0", "1", "2"]) as c:
        memfit.profile(model, x, y, optimizer="adam", mode=mode)
    assert c.recorded and c.complete
    assert (c.forward, c.backward) == (FORWARD, BACKWARD)
    assert c.blocks == {"0": 2 * 8 * 64 * 128, "1": 0, "2": 2 * 8 * 128 * 10}
    # Nothing counts once the block is left.
    f = count_step_flops(model, x, y)
    assert (f.forward, f.backward) == (FORWARD, BACKWARD)


def test_a_convolution_is_left_to_torchs_counter():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 6 * 6, 10))
    x, y = torch.randn(2, 3, 8, 8), torch.randint(0, 10, (2,))
    with counting_flops([]) as c:
        memfit.profile(model, x, y, optimizer="sgd", mode="meta")
    assert c.recorded and not c.complete
    assert "aten::convolution" in c.uncounted


transformers = pytest.importorskip("transformers")
CONFIG = dict(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              use_cache=False)
BLOCKS = ["model.layers.0", "model.layers.1"]


def tiny_llama():
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))


def batch():
    ids = torch.zeros(2, 64, dtype=torch.long, device="meta")
    return {"input_ids": ids, "labels": ids}


def loss(out):
    return out.loss


def recorded(model):
    with counting_flops(BLOCKS) as c:
        memfit.profile(model, batch(), loss_fn=loss, optimizer=torch.optim.AdamW(
            model.parameters()), mode="meta")
    assert c.recorded and c.complete
    return c


def test_a_llama_counts_what_torchs_counter_counts():
    model = tiny_llama()
    c = recorded(model)
    f = count_step_flops(model, batch(), loss_fn=loss)
    assert (c.forward, c.backward, c.blocks) == (f.forward, f.backward, f.blocks)
    # Each decoder layer: 7 projections of 128 tokens, 2 FLOPs a weight.
    per_token = 256 * 256 + 256 * 128 + 256 * 128 + 256 * 256 + 3 * 256 * 512
    assert c.blocks == {b: 2 * 128 * per_token for b in BLOCKS}


def test_hf_checkpointing_counts_each_layers_forward_again_in_backward():
    plain = recorded(tiny_llama())
    model = tiny_llama()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    c = recorded(model)
    assert c.forward == plain.forward
    assert c.blocks == plain.blocks  # the recompute is backward's, not a block's forward
    assert c.backward == plain.backward + sum(plain.blocks.values())


def test_advise_on_meta_counts_the_flops_of_the_steps_it_records(monkeypatch):
    def not_again(*_a, **_k):
        raise AssertionError("advise counted a step's FLOPs by running it again")

    monkeypatch.setattr("memfit.plan.advise.count_step_flops", not_again)
    model = tiny_llama()
    advice = memfit.advise(model, batch(), loss_fn=loss,
                           optimizer=torch.optim.AdamW(model.parameters()), budget="1GiB",
                           mode="meta", allow_approximate=True, settings=None)
    plain = recorded(model)
    every = next(r for r in advice.rows if r.kind == "checkpointing"
                 and len(r.strategy.checkpoint) == 2)
    step = plain.forward + plain.backward
    assert every.time_ratio == pytest.approx((step + sum(plain.blocks.values())) / step)
