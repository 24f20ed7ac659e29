"""The card plans' public entry points used wrongly, as a hostile user
would: advise(cards=...), Advice.apply / apply_plan / setting /
optimizer_for and a Setting's apply. Each wrong input is refused in one
line that names the cause and what to do."""

import pytest
import torch

import memfit
from memfit.plan.strategies.llm_settings import llm_settings
from memfit.testing.models import tiny_llama

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

LORA = "bf16 weights, LoRA r=8 (q_proj, v_proj)"


def hf_loss(out):
    return out.loss


def meta_batch():
    ids = torch.zeros(4, 9, dtype=torch.long, device="meta")
    return {"input_ids": ids, "labels": ids}


def few_settings(model):
    proposed, _ = llm_settings(model)
    return [st for st in proposed if st.label in ("HF gradient checkpointing", LORA)]


def advise(model, **kw):
    return memfit.advise(model, meta_batch(), loss_fn=hf_loss, optimizer="sgd", repeats=0,
                         settings=few_settings(model), **kw)


@pytest.fixture(scope="module")
def carded():
    """advise of a tiny Llama on meta with two cards and no budget."""
    model = tiny_llama("meta")
    return model, advise(model, cards=["1GiB", "1KiB"])


def test_cards_given_as_a_dict_are_refused_saying_to_pass_its_budgets():
    # Guards against what was: a dict's keys were read as the budgets.
    with pytest.raises(TypeError, match=r"^\[advise\] cards is a list of card budgets, got a "
                       r"dict: pass cards=list\(your_dict.values\(\)\)"):
        advise(tiny_llama("meta"), cards={"8GiB": "my laptop"})


def test_a_card_given_twice_is_refused():
    # Guards against what was: the same card planned and printed twice.
    with pytest.raises(ValueError, match=r"^\[advise\] cards lists 1.00 GiB more than once: "
                       r"give each card once"):
        advise(tiny_llama("meta"), cards=["1GiB", 1 << 30])


def test_apply_of_something_not_a_model_names_the_model(carded):
    # Guards against what was: a bare StopIteration.
    _, advice = carded
    with pytest.raises(TypeError, match=r"^\[Advice.apply\] model must be the torch.nn.Module "
                       r"advise was given, got NoneType"):
        advice.apply(None, advice.rows[0])


def test_apply_takes_a_row_by_its_name_and_refuses_other_things(carded):
    # Guards against what was: "'str' object has no attribute 'setting'".
    model, advice = carded
    name = "checkpoint every block (2 of 2)"
    with advice.apply(model, name):
        assert "forward" in model.model.layers[0].__dict__
    assert "forward" not in model.model.layers[0].__dict__
    with pytest.raises(ValueError, match=r"^\[Advice.apply\] no row is named 'checkpoint all': "
                       r"one of \["):
        advice.apply(model, "checkpoint all")
    with pytest.raises(TypeError, match=r"^\[Advice.apply\] what must be a Row, a row's name, a "
                       r"Plan or a Strategy \(None: the plan\), got int"):
        advice.apply(model, 3)


def test_apply_without_a_plan_says_there_is_none(carded):
    # Guards against what was: with no budget, apply(model) put nothing on
    # the model without a word.
    model, advice = carded
    with pytest.raises(ValueError, match=r"^\[Advice.apply\] the advice has no plan: advise was "
                       r"given no budget; .*advice.apply_plan\(model, card=...\)"):
        advice.apply(model)


def test_a_setting_strategy_in_apply_points_to_apply_plan(carded):
    model, advice = carded
    row = next(r for r in advice.rows if r.name == LORA)
    with pytest.raises(ValueError, match=r"^\[Advice.apply\] the strategy uses the setting "
                       r".*call advice.apply_plan\(model, optimizer\)"):
        advice.apply(model, row)


def test_setting_takes_a_row_and_refuses_what_is_not_a_name(carded):
    # Guards against what was: setting(None) said "no setting None was
    # proposed", and a Row was printed whole as an unknown label.
    _, advice = carded
    row = next(r for r in advice.rows if r.name == LORA)
    assert advice.setting(row).label == LORA
    with pytest.raises(TypeError, match=r"^\[Advice.setting\] label must be a setting's name "
                       r"\(a str, e.g. plan.strategy.setting\), got NoneType"):
        advice.setting(None)


def test_a_setting_applied_to_another_model_or_twice_is_refused(carded):
    # Guards against what was: peft's NoMatchingPeftModuleError, an
    # AttributeError for HF checkpointing, and LoRA wrapped in LoRA.
    _, advice = carded
    for label in ("HF gradient checkpointing", LORA):
        with pytest.raises(TypeError, match=r"^\[Setting.apply\] the settings change an HF "
                           r"causal LM .*got Linear"):
            advice.setting(label).apply(torch.nn.Linear(2, 2))
    wrapped = advice.setting(LORA).apply(tiny_llama("meta"))
    with pytest.raises(ValueError, match=r"^\[Setting.apply\] the model is already a PEFT model "
                       r"\(PeftModel\): apply the setting to the model advise was given, once"):
        advice.setting(LORA).apply(wrapped)


def test_apply_plan_names_the_card_to_pass(carded):
    model, advice = carded
    with pytest.raises(ValueError, match=r"^\[Advice.apply_plan\] advise was given cards and no "
                       r"budget: pass card= one of \['1.00 KiB', '1.00 GiB'\]"):
        advice.apply_plan(model)
    with pytest.raises(ValueError, match=r"^\[Advice.apply_plan\] no card of 2.00 GiB was "
                       r"planned: advise's cards are \['1.00 KiB', '1.00 GiB'\]"):
        advice.apply_plan(model, card="2GiB")
    with pytest.raises(ValueError, match=r"^\[Advice.apply_plan\] nothing measured fits the card "
                       r"of 1.00 KiB: the least measured, .* peaks at .*; pick a bigger card"):
        advice.apply_plan(model, card="1KiB")


def test_apply_plan_refuses_another_model_and_a_bad_optimizer(carded):
    model, advice = carded
    with pytest.raises(ValueError, match=r"^\[Advice.apply_plan\] the advice was made for a "
                       r"LlamaForCausalLM, got a Linear"):
        advice.apply_plan(torch.nn.Linear(2, 2), card="1GiB")
    with pytest.raises(TypeError, match=r"^\[Advice.apply_plan\] optimizer must be a "
                       r"torch.optim.Optimizer, a name or None, got int"):
        advice.apply_plan(tiny_llama("meta"), optimizer=3, card="1GiB")


def test_apply_plan_of_a_lora_plan_refuses_a_model_already_wrapped():
    model = tiny_llama("meta")
    lora_only = [st for st in few_settings(model) if st.label == LORA]
    advice = memfit.advise(model, meta_batch(), loss_fn=hf_loss, optimizer="sgd", repeats=0,
                           settings=lora_only, allow_approximate=True, budget="160KiB")
    assert advice.plan.strategy.setting == LORA, advice.table()
    applied = advice.apply_plan(tiny_llama("meta"), torch.optim.SGD([torch.zeros(1)], lr=0.1))
    assert type(applied.model).__name__ == "PeftModel"
    with pytest.raises(ValueError, match=r"^\[Advice.apply_plan\] the model is already a PEFT "
                       r"model \(PeftModel\) and the plan's setting .* makes one itself: pass "
                       r"the model advise was given"):
        advice.apply_plan(applied.model)


def test_a_setting_on_a_compiled_model_says_to_apply_it_before_compiling(carded):
    # Guards against what was: "the settings change an HF causal LM, got
    # OptimizedModule" for the very model advise was given, compiled.
    _, advice = carded
    compiled = torch.compile(tiny_llama("meta"))
    with pytest.raises(ValueError, match=r"^\[Setting.apply\] LlamaForCausalLM is compiled "
                       r"\(torch.compile\): apply the setting to the model before compiling it"):
        advice.setting(LORA).apply(compiled)
