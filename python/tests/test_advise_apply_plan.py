"""Advice.apply_plan: a card's whole plan from memfit.advise(..., cards=[...])
(its setting, checkpointing, chunked loss, optimizer and micro-batch) put on
an HF Llama in one call, and trained for 3 steps under the card's simulated
budget without an OOM; and each wrong use of the card plans refused in one
line that names the cause."""

import copy
import gc

import pytest
import torch

import memfit
from memfit.plan.strategies.llm_settings import llm_settings
from memfit.testing.models import tiny_llama

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")
pytestmark = pytest.mark.slow  # advise with QLoRA rows, then QLoRA steps on the CPU: ~1 min

# Width 128: q_proj and o_proj hold 16,384 weights, what torchao's NF4 needs.
WIDE = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_attention_heads=4,
            num_key_value_heads=2, use_cache=False)


def llama_batch():
    ids = torch.randint(0, 512, (8, 32), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}


def hf_loss(out):
    return out.loss


@pytest.fixture(scope="module")
def card_plans():
    """advise on a bf16 Llama with two cards: one where checkpointing and
    micro-batches do, one that needs QLoRA with the chunked loss too."""
    pytest.importorskip("torchao")
    model = tiny_llama(dtype=torch.bfloat16, **WIDE)
    batch = llama_batch()
    proposed, _ = llm_settings(model, 1 << 20)
    settings = [st for st in proposed if st.label.startswith("chunked loss")
                or (st.label.startswith("QLoRA") and "chunked loss" in st.label)]
    # The plain step on meta, as advise measures the plans: no CPU kernel's
    # per-thread buffers, so the cards are the same at any thread count. The
    # first card is below every plan of the plain step's numbers (the least,
    # every block checkpointed in micro-batches of 1, peaks at 0.399 of the
    # plain step) and above QLoRA's with the chunked loss (0.365): only a
    # setting fits it, whichever plan the recorded times rank first. At
    # 0.4, one thread fit the first of them to the byte.
    # The plans train under memfit.Trainer, whose micro-batches drop the
    # logits once the loss exists: keep_output=False, that loop.
    plain = memfit.profile(model, batch, loss_fn=hf_loss, optimizer="sgd", mode="meta",
                           keep_output=False).peak_bytes
    cards = [int(plain * 0.38), int(plain * 0.5)]
    advice = memfit.advise(model, batch, loss_fn=hf_loss, optimizer="sgd", repeats=0,
                           settings=settings, allow_approximate=True, mode="meta", cards=cards,
                           keep_output=False)
    return model, batch, advice


def train_three_steps(model, advice, card, batch):
    """Three memfit.Trainer steps of the plan applied to a copy of `model`,
    the steps under the card's budget (the copy's weights count: they are
    made inside the outer budget, which the card's nests in)."""
    with memfit.simulated_device("1GiB"):
        m = copy.deepcopy(model)
        applied = advice.apply_plan(m, torch.optim.SGD(m.parameters(), lr=1e-3), card=card)
        with memfit.simulated_device(card):
            trainer = memfit.Trainer(applied.model, applied.optimizer,
                                     micro_batch=applied.micro_batch, plan=False,
                                     reduction="mean")
            reports = [trainer.step(batch) for _ in range(3)]
    model_class = type(applied.model).__name__
    del m, applied, trainer
    gc.collect()
    return model_class, reports


def test_a_card_plan_with_qlora_and_the_chunked_loss_trains_its_peft_copy_within_the_card(
        card_plans):
    model, batch, advice = card_plans
    card = advice.cards[0]
    s = card.plan.strategy
    assert card.plan.found, advice.cards_table()
    assert s.setting.startswith("QLoRA") and "chunked loss" in s.setting
    assert s.checkpoint and card.plan.micro_batch > 0
    model_class, reports = train_three_steps(model, advice, card.budget_bytes, batch)
    assert model_class == "PeftModel"
    assert [r.ooms_recovered for r in reports] == [0, 0, 0]
    assert [r.micro_batch for r in reports] == [card.plan.micro_batch] * 3
    assert all(r.peak_bytes <= card.budget_bytes for r in reports)
    assert all(torch.isfinite(torch.as_tensor(r.loss)) for r in reports)


def test_a_card_plan_of_checkpointing_and_micro_batches_trains_the_hf_llama_within_the_card(
        card_plans):
    model, batch, advice = card_plans
    card = advice.cards[1]
    s = card.plan.strategy
    assert card.plan.found and s.setting is None, advice.cards_table()
    assert s.checkpoint and card.plan.micro_batch > 0
    model_class, reports = train_three_steps(model, advice, card.budget_bytes, batch)
    assert model_class == "LlamaForCausalLM"
    assert [r.ooms_recovered for r in reports] == [0, 0, 0]
    assert all(r.peak_bytes <= card.budget_bytes for r in reports)


def test_apply_plan_puts_the_setting_checkpointing_and_chunked_loss_on_the_model(card_plans):
    model, batch, advice = card_plans
    m = copy.deepcopy(model)
    user_opt = torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9)
    with advice.apply_plan(m, user_opt, card=advice.cards[0].budget_bytes) as applied:
        peft_model = applied.model
        base = peft_model.get_base_model()
        layers = base.model.layers
        assert all("forward" in layer.__dict__ for layer in layers)  # checkpointed
        assert peft_model(**batch).logits is None  # the chunked loss: no whole logits
        # The user's optimizer, rebuilt over the adapters with its hyperparameters.
        opt = applied.optimizer
        group = opt.param_groups[0]
        assert type(opt) is torch.optim.SGD and (group["lr"], group["momentum"]) == (0.5, 0.9)
        trained = {id(p) for g in opt.param_groups for p in g["params"]}
        assert trained == {id(p) for p in peft_model.parameters() if p.requires_grad}
        assert trained and all("lora" in n for n, p in peft_model.named_parameters()
                               if p.requires_grad)
    assert not any("forward" in layer.__dict__ for layer in layers)  # restored
