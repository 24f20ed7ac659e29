"""What fits on which card: one advise call plans every card
from the same recordings, as advise plans each budget alone; and a plan
applied to a small Llama (its setting, checkpointing and micro-batches)
trains 3 steps under a simulated device of the planned budget without an
out-of-memory error."""

import pytest
import torch

import memfit
from memfit.plan.strategies import checkpointed
from memfit.plan.strategies.llm_settings import materialize, user_optimizer_on
from memfit.plan.strategies.quantized import torchao_available

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
if not torchao_available():
    pytest.skip("torchao does not import", allow_module_level=True)

CONFIG = dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              use_cache=False)


def tiny_llama(device="cpu"):
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))


def inputs(device="cpu", b=4, t=64):
    ids = torch.zeros(b, t, dtype=torch.long, device=device)
    if device != "meta":
        ids = torch.randint(0, CONFIG["vocab_size"], (b, t),
                            generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids}


def loss(out):
    return out.loss


def advise(model, x, **kw):
    return memfit.advise(model, x, loss_fn=loss, optimizer=torch.optim.AdamW(model.parameters()),
                         repeats=0, allow_approximate=True, **kw)


@pytest.fixture(scope="module")
def meta_case():
    model = tiny_llama("meta")
    x = inputs("meta")
    rows = advise(model, x)
    peaks = sorted({r.peak_bytes for r in rows.rows if r.kind == "setting"})
    # Cards between the lowest setting and the plain step, and one below
    # all: 1 MiB holds no setting's weights (the bf16 embeddings alone are
    # 2 MiB). Half the lowest row's peak is not "below all": micro-batches
    # and checkpointing plan under a row's full-batch peak.
    cards = [2**20, peaks[0] // 2, peaks[0] + (peaks[1] - peaks[0]) // 2, peaks[-1],
             rows.plain_peak_bytes * 2]
    return model, x, cards, advise(model, x, cards=cards)


def test_each_card_gets_the_plan_advise_gives_its_budget_alone(meta_case):
    model, x, cards, advice = meta_case
    assert [c.budget_bytes for c in advice.cards] == sorted(cards)
    for card in advice.cards:
        try:
            alone = advise(model, x, budget=card.budget_bytes).plan
        except memfit.DoesNotFit:
            assert not card.plan.found
            continue
        assert card.plan.found
        assert (card.plan.summary, card.plan.peak_bytes) == (alone.summary, alone.peak_bytes)
        assert card.plan.peak_bytes <= card.budget_bytes


def test_a_larger_card_never_gets_a_plan_that_changes_more(meta_case):
    _, _, _, advice = meta_case
    found = [c.plan.found for c in advice.cards]
    assert found == sorted(found), advice.cards_table()  # none fits, then every larger card
    assert not found[0] and found[-1], advice.cards_table()
    # The largest card runs the plain step: nothing to change.
    assert advice.cards[-1].plan.summary == "the plain step"
    table = advice.cards_table()
    assert table.count("\n") >= len(advice.cards) + 2
    assert "nothing measured fits" in table


def own_tensors(model):
    """Each parameter's and buffer's storage copied, so the simulated device
    counts them (it counts what is allocated inside it); an NF4 weight's
    storages are its inner tensors (codes, scales, ...)."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if hasattr(t, "__tensor_flatten__"):
                names, _ = t.__tensor_flatten__()
                for leaf in (getattr(t, n) for n in names):
                    leaf.data = leaf.data.clone()
            else:
                t.data = t.data.clone()


@pytest.mark.slow
def test_the_plan_applied_trains_3_steps_within_its_budget():
    model = tiny_llama()
    x = inputs(b=4, t=32)
    rows = advise(model, x, target_device="cpu")
    qlora = next(r for r in rows.rows if r.name.startswith("QLoRA") and "chunked" in r.name)
    budget = int(qlora.peak_bytes * 1.02)
    advice = advise(model, x, budget=budget, target_device="cpu")
    p = advice.plan
    assert p.found and p.peak_bytes <= budget
    assert p.strategy.setting and p.strategy.optimizer is None and not p.strategy.autocast_bf16
    st = advice.setting(p.strategy.setting)
    user = torch.optim.AdamW(model.parameters())
    n = x["input_ids"].shape[0]
    mb = p.micro_batch or n
    ooms = 0
    # The setting is applied on the CPU, outside the budget, as one loads a
    # model in bf16 or quantizes it before moving it to the card: the rows
    # count the changed model's weights, not the fp32 copy it was made from.
    m, prefix = materialize(model, st)
    with memfit.simulated_device(budget):
        own_tensors(m)
        opt = st.optimizer(m, user) if st.optimizer else user_optimizer_on(m, user)
        paths = [f"{prefix}.{q}" if prefix else q for q in advice.chain.block_paths]
        with checkpointed([m.get_submodule(paths[i]) for i in p.strategy.checkpoint]):
            for _ in range(3):
                try:
                    for start in range(0, n, mb):
                        part = {k: v[start:start + mb] for k, v in x.items()}
                        k = part["input_ids"].shape[0]
                        (m(**part).loss * (k / n)).backward()
                    opt.step()
                    opt.zero_grad(set_to_none=not (p.strategy.zero_grad_in_place or mb < n))
                except torch.OutOfMemoryError:
                    ooms += 1
    assert ooms == 0
    # The plan was the tight one: the plain step does not fit the budget.
    assert advice.plain_peak_bytes > budget
