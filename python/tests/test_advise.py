import copy
import json

import pytest
import torch

import memfit
from memfit.plan.strategies.eval_step import profile_eval
from memfit.testing.models import tiny_llama

pytestmark = pytest.mark.torch_api  # see python/tests/conftest.py

WIDTH = 64
HIDDEN = (64, 256, 128, 512, 192, 96)  # uneven blocks


def blocks_mlp():
    torch.manual_seed(0)

    def block(h):
        return torch.nn.Sequential(
            torch.nn.Linear(WIDTH, h), torch.nn.ReLU(), torch.nn.Linear(h, WIDTH), torch.nn.ReLU()
        )

    return torch.nn.Sequential(*[block(h) for h in HIDDEN])


def mlp_batch(n=256):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, WIDTH, generator=g), torch.randn(n, WIDTH, generator=g)


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(
            d_model=32, nhead=4, dim_feedforward=128, dropout=0.1, batch_first=True
        )
        self.encoder = torch.nn.TransformerEncoder(layer, num_layers=3)
        self.head = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.head(self.encoder(x)).mean(dim=1)


def encoder_batch(n=16):
    g = torch.Generator().manual_seed(2)
    return torch.randn(n, 32, 32, generator=g), torch.randint(0, 8, (n,), generator=g)


def row(advice, prefix):
    return next(r for r in advice.rows if r.name.startswith(prefix))


@pytest.fixture(scope="module")
def mlp_case():
    model = blocks_mlp()
    x, y = mlp_batch()
    free = memfit.advise(model, x, y, repeats=1)
    plain = row(free, "plain").peak_bytes
    every = row(free, "checkpoint every").peak_bytes
    budget = (plain + every) // 2
    planned = memfit.advise(model, x, y, budget=budget, repeats=1)
    return dict(model=model, x=x, y=y, free=free, budget=budget, planned=planned)


@pytest.fixture(scope="module")
def encoder_case():
    model = Encoder()
    x, y = encoder_batch()
    return dict(model=model, x=x, y=y, advice=memfit.advise(model, x, y, repeats=1))


def reprofile(advice, model, x, y, r):
    """The row's strategy applied to the model and profiled again."""
    s = r.strategy
    with advice.apply(model, r):
        if s.step != "train":
            return profile_eval(model, x, y, step=s.step).peak_bytes
        opt = s.optimizer or "adam"
        if s.host_state:
            opt = memfit.offload(torch.optim.Adam(model.parameters(), lr=1e-3))
        if s.zero_grad_in_place:
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            opt.zero_grad = lambda set_to_none=True: torch.optim.Optimizer.zero_grad(
                opt, set_to_none=False
            )
        return memfit.profile(model, x, y, optimizer=opt).peak_bytes


def plain_gradients(model, x, y, loss_fn, seed=0):
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    loss_fn(model(x), y).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def test_every_row_reprofiled_with_its_strategy_gives_its_peak(mlp_case):
    advice, model, x, y = mlp_case["planned"], mlp_case["model"], mlp_case["x"], mlp_case["y"]
    kinds = {r.kind for r in advice.rows}
    # bf16 ("precision") is recorded with allow_approximate only: see
    # test_a_budget_nothing_exact_meets_names_the_smallest_peak.
    assert {"baseline", "memory", "checkpointing", "optimizer", "eval"} <= kinds
    assert "precision" not in kinds and any("autocast bf16" in n for n in advice.notes)
    for r in advice.rows:
        again = reprofile(advice, model, x, y, r)
        assert abs(again - r.peak_bytes) <= 0.03 * r.peak_bytes, r.name
        assert r.saving_bytes == advice.plain_peak_bytes - r.peak_bytes


def test_rows_on_the_transformer_reprofile_to_their_peaks(encoder_case):
    advice, model, x, y = (encoder_case[k] for k in ("advice", "model", "x", "y"))
    for r in advice.rows:
        if r.kind in ("checkpointing", "precision", "eval"):
            again = reprofile(advice, model, x, y, r)
            assert abs(again - r.peak_bytes) <= 0.03 * r.peak_bytes, r.name


def test_checkpointing_lowers_the_peak_and_the_plan_recomputes_less(mlp_case):
    free, advice, budget = mlp_case["free"], mlp_case["planned"], mlp_case["budget"]
    plain = row(advice, "plain")
    every = row(advice, "checkpoint every")
    planned = row(advice, "checkpoint planned")
    assert every.peak_bytes < plain.peak_bytes
    assert not plain.fits and every.fits
    assert planned.fits and planned.peak_bytes <= budget
    assert 0 < planned.recompute_ns <= every.recompute_ns
    assert len(planned.strategy.checkpoint) < len(HIDDEN)
    # The rule table compares the core planner's choices on the same chain.
    rules = {p.rule: p for p in advice.chain_plans}
    assert rules["optimal"].recompute_ns <= rules["every layer"].recompute_ns
    assert rules["none"].predicted_peak == plain.peak_bytes
    # Without a budget there is no planned row and no plan.
    assert not any(r.name.startswith("checkpoint planned") for r in free.rows)
    assert not free.plan.found and all(r.fits is None for r in free.rows)


@pytest.mark.parametrize("case", ["mlp", "encoder"])
def test_checkpointed_gradients_equal_the_plain_step(case, mlp_case, encoder_case):
    if case == "mlp":
        model, x, y, advice = (mlp_case[k] for k in ("model", "x", "y", "planned"))
        loss_fn = torch.nn.functional.mse_loss
    else:
        model, x, y, advice = (encoder_case[k] for k in ("model", "x", "y", "advice"))
        loss_fn = torch.nn.functional.cross_entropy  # with dropout: the RNG replays
    plain = plain_gradients(model, x, y, loss_fn)
    for r in advice.rows:
        if r.kind != "checkpointing":
            continue
        with advice.apply(model, r):
            got = plain_gradients(model, x, y, loss_fn)
        # Bit for bit: checkpointing reruns each block's forward with the same
        # kernels on the same tensors (dropout's RNG state replayed) and the
        # backward is the plain one's (measured 0 with oneDNN on AMX and AVX2).
        for g, want in zip(got, plain):
            assert torch.equal(g, want), r.name
    for m in model.modules():
        assert "forward" not in m.__dict__  # the original forwards are back


def test_plan_trains_under_the_budget_with_the_plain_losses(mlp_case):
    advice, budget = mlp_case["planned"], mlp_case["budget"]
    x, y = mlp_case["x"], mlp_case["y"]
    assert advice.plan.found and advice.plan.exact
    assert advice.plan.strategy.checkpoint and advice.plan.peak_bytes <= budget

    def train(plan, budget):
        model = blocks_mlp()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        trainer = memfit.Trainer(model, opt, torch.nn.MSELoss(), budget=budget)
        torch.manual_seed(3)
        if plan is None:
            return [trainer.step(x, y) for _ in range(3)]
        with plan.apply(model):
            return [trainer.step(x, y) for _ in range(3)]

    plain = train(None, None)
    planned = train(advice, budget)
    # Bit for bit: one micro-batch each (weight 1), the same forward kernels, and
    # the checkpointed backward gives the plain gradients to the bit (see
    # test_checkpointed_gradients_equal_the_plain_step), so Adam's steps agree too.
    for p, q in zip(plain, planned):
        assert q.ooms_recovered == 0 and q.micro_batches == 1
        assert q.loss == p.loss
    # The plain step alone does not fit: the Trainer has to split it.
    split = train(None, budget)
    assert any(r.ooms_recovered > 0 or r.micro_batches > 1 for r in split)


def test_a_budget_nothing_exact_meets_names_the_smallest_peak(mlp_case):
    model, x, y = (mlp_case[k] for k in ("model", "x", "y"))
    # Under a budget no single strategy meets at the whole batch, every
    # combination with checkpointing is measured: the lowest exact peak, and
    # the lower approximate one (bf16).
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    alone = min(r.peak_bytes for r in mlp_case["free"].rows if r.kind != "eval")
    low = memfit.advise(model, x, y, budget=alone - 1, allow_approximate=True, repeats=0)
    rows = [r for r in low.rows if r.kind != "eval"]
    assert sum(r.kind == "combination" for r in rows) >= 4
    # Under the weights alone, every floor (outside forward and backward) is
    # over: no combination is recorded, and a note names them with their floors.
    with pytest.raises(memfit.DoesNotFit) as none:
        memfit.advise(model, x, y, budget=weights, allow_approximate=True, repeats=0)
    assert not any(r.kind == "combination" for r in none.value.advice.rows)
    assert any(n.startswith("not combined with checkpointing every block") and
               "optimizer sgd instead of adam (" in n for n in none.value.advice.notes)
    # With allow_approximate the bf16 row is recorded, and reprofiles to its peak.
    bf16 = next(r for r in rows if r.kind == "precision")
    again = reprofile(low, model, x, y, bf16)
    assert abs(again - bf16.peak_bytes) <= 0.03 * bf16.peak_bytes
    smallest = min((r for r in rows if r.exact), key=lambda r: r.peak_bytes)
    lightest = min((r for r in rows if not r.exact), key=lambda r: r.peak_bytes)
    assert lightest.peak_bytes < smallest.peak_bytes
    budget = (smallest.peak_bytes + lightest.peak_bytes) // 2
    # No exact strategy fits the whole batch there, but micro-batches do
    # (the planner searches them since one planner serves both fronts): the
    # plan stays exact.
    mid = memfit.advise(model, x, y, budget=budget, repeats=1)
    assert mid.plan.found and mid.plan.exact and mid.plan.micro_batch > 0
    assert mid.plan.peak_bytes <= budget
    # Allowed to change the numbers, the plan still prefers the exact one.
    ok = memfit.advise(model, x, y, budget=budget, allow_approximate=True, repeats=1)
    assert ok.plan.found and ok.plan.exact and ok.plan.peak_bytes <= budget
    # Below every exact plan, the error names the lowest peak the search
    # reached (micro-batches included) and what allow_approximate adds.
    with pytest.raises(memfit.DoesNotFit) as e:
        memfit.advise(model, x, y, budget=weights, repeats=1)
    floor = e.value.advice.plan
    assert not floor.found
    msg = str(e.value)
    assert memfit.format_bytes(floor.peak_bytes) in msg
    assert floor.summary in msg and "allow_approximate=True" in msg
    assert isinstance(e.value, ValueError) and e.value.advice.rows


def test_the_planner_binding_finds_the_cheapest_choice_that_fits():
    import itertools

    from memfit import _memfit

    segs = [
        _memfit.ChainSegment(name=str(i), activation_bytes=a, recompute_ns=t)
        for i, (a, t) in enumerate([(400, 5.0), (100, 1.0), (900, 2.0), (300, 7.0), (500, 3.0)])
    ]
    mem = _memfit.ChainMemory(forward_fixed=1000, backward_fixed=1200, other_peak=1500)
    for budget in (1500, 2000, 2600, 3000):
        fitting = [
            _memfit.chain_recompute_ns(segs, list(c))
            for c in itertools.product([False, True], repeat=len(segs))
            if _memfit.chain_peak(segs, mem, list(c)) <= budget
        ]
        plan = _memfit.chain_plan_optimal(segs, mem, budget)
        assert plan.fits == bool(fitting)
        if fitting:
            assert plan.recompute_ns == min(fitting)
            assert plan.predicted_peak <= budget
    with pytest.raises(ValueError, match="3 flags for 5 segments"):
        _memfit.chain_peak(segs, mem, [True] * 3)


def test_a_budget_below_the_parameters_is_refused_before_measuring():
    model = blocks_mlp()
    x, y = mlp_batch()
    params = sum(p.numel() * 4 for p in model.parameters())
    with pytest.raises(memfit.DoesNotFit, match=r"below the model's own parameters"):
        memfit.advise(model, x, y, budget=params - 1)


def test_a_chain_outside_the_model_is_refused():
    model = blocks_mlp()
    x, y = mlp_batch(8)
    with pytest.raises(ValueError, match="not inside the model"):
        memfit.advise(model, x, y, chain=torch.nn.Sequential(torch.nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="block 1 .Linear. is not a module of the model"):
        memfit.advise(model, x, y, chain=[model[0], torch.nn.Linear(2, 2)])


def test_the_chain_is_found_in_a_transformer_encoder(encoder_case):
    advice = encoder_case["advice"]
    assert advice.chain.path == "encoder.layers" and advice.chain.found
    assert advice.chain.block_paths == ["encoder.layers.0", "encoder.layers.1",
                                        "encoder.layers.2"]
    assert "encoder.layers (3 blocks, found)" in advice.table()
    assert row(advice, "checkpoint every").saving_bytes > 0


def test_a_chain_given_as_a_list_is_used(mlp_case):
    model = blocks_mlp()
    x, y = mlp_batch(32)
    advice = memfit.advise(model, x, y, chain=[model[1], model[3]], repeats=1)
    assert advice.chain.block_paths == ["1", "3"] and not advice.chain.found
    assert row(advice, "checkpoint every").name == "checkpoint every block (2 of 2)"


def test_a_chain_given_as_a_path_is_used():
    model = torch.nn.Sequential(torch.nn.Identity(), blocks_mlp())
    x, y = mlp_batch(8)
    with pytest.raises(ValueError, match=r"chain='1.body' is not a submodule of the model"):
        memfit.advise(model, x, y, chain="1.body")
    advice = memfit.advise(model, x, y, chain="1", repeats=0)
    assert advice.chain.path == "1" and not advice.chain.found
    assert advice.chain.block_paths == [f"1.{i}" for i in range(len(model[1]))]


def test_table_and_json_carry_the_rows_and_the_plan(mlp_case):
    advice = mlp_case["planned"]
    text = advice.table()
    for column in ("strategy", "peak", "saving", "time", "fits", "result"):
        assert column in text.splitlines()[4]
    assert "plan: checkpoint blocks" in text and "same result" in text
    doc = json.loads(advice.to_json())
    assert set(doc) == {
        "model", "batch", "budget_bytes", "optimizer", "parameter_bytes", "peaks",
        "plain_peak_bytes", "plain_step_ms", "chain", "strategies", "checkpoint_rules", "plan",
        "notes",
    }
    assert doc["peaks"] == "allocated"  # a CPU model is planned for the CPU
    assert doc["budget_bytes"] == mlp_case["budget"]
    assert [s["name"] for s in doc["strategies"]] == [r.name for r in advice.rows]
    assert doc["plan"]["strategy"]["checkpoint"] == list(advice.plan.strategy.checkpoint)


def test_advise_leaves_the_model_and_the_rng_as_they_were():
    model = blocks_mlp()
    before = copy.deepcopy(model.state_dict())
    x, y = mlp_batch(16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(5)
    memfit.advise(model, x, y, optimizer=opt, repeats=1)
    after_rng = torch.rand(1)
    torch.manual_seed(5)
    assert torch.equal(after_rng, torch.rand(1))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    assert all(p.grad is None for p in model.parameters()) and len(opt.state) == 0
    assert all("forward" not in m.__dict__ for m in model.modules())


class MlpBlock(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.ln = torch.nn.LayerNorm(width)
        self.fc = torch.nn.Linear(width, 4 * width)
        self.out = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln(x))))


class HeadHeavy(torch.nn.Module):
    """Residual blocks under a wide output head, as the demo's small GPT:
    the loss head's backward (the logits' gradient) peaks before the
    chain's."""

    def __init__(self, width=128, vocab=1024):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList(MlpBlock(width) for _ in range(2))
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def test_predicted_checkpointing_peaks_equal_the_measured_ones():
    # 'every layer' was once predicted 18.91 MiB and measured
    # 15.16 MiB on the demo gpt: the loss head's backward transients were
    # counted beside every block's backward.
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 64, 128, generator=g)
    y = torch.randint(0, 1024, (8, 64), generator=g)

    def loss_fn(out, target):
        return torch.nn.functional.cross_entropy(out.flatten(0, 1), target.flatten())

    a = memfit.advise(HeadHeavy(), x, y, loss_fn=loss_fn, repeats=1)
    rows = [r for r in a.rows if r.kind == "checkpointing"]
    assert rows
    for r in rows:
        assert abs(r.predicted_peak_bytes - r.peak_bytes) <= 0.01 * r.peak_bytes, r.name


def test_nothing_fits_names_the_phase_and_the_cause_not_a_smaller_batch():
    # A budget below the weights and their gradients.
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU())
                                  for _ in range(3)])
    x, y = torch.randn(4, 256), torch.randn(4, 256)
    params = sum(p.nbytes for p in model.parameters())
    with pytest.raises(memfit.DoesNotFit) as e:
        memfit.advise(model, x, y, optimizer="adam", budget=params * 3 // 2, repeats=1)
    msg = str(e.value)
    assert ("The plain step peaks in the optimizer step, with optimizer state 1.51 MiB, "
            "parameters 771.00 KiB, gradients 771.00 KiB") in msg
    assert ("The model alone (parameters and their gradients) exceeds the memory: a smaller "
            "batch cannot help; use a bigger card, shard the model") in msg
    assert "a smaller batch lowers" not in msg
    del e


def test_a_model_on_the_meta_device_is_advised_on_meta_and_its_plan_is_unverified():
    # A model larger than the machine, built on meta (here a tiny
    # HF Llama from its config): every row and the plan are recorded on meta,
    # nothing runs for real, and the advice says the plan is unverified.
    pytest.importorskip("transformers")
    model = tiny_llama("meta", vocab_size=256, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                       max_position_embeddings=64)
    ids = torch.empty(2, 32, dtype=torch.long, device="meta")

    def loss_fn(out, target):
        return torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), target.flatten())

    free = memfit.advise(model, ids, ids, loss_fn=loss_fn, optimizer="adam")
    assert free.chain.path == "model.layers" and len(free.chain) == 3
    assert all(r.meta for r in free.rows[1:]) and all(r.kind != "eval" for r in free.rows)
    # A meta clock times dispatch, not work: no time is estimated from it;
    # the rows' times are FLOPs counted on meta instead, labelled so
    # (estimated, never measured).
    assert not any(r.time_measured for r in free.rows if r.kind not in ("baseline", "memory"))
    assert "~: time estimated from FLOPs counted on meta" in free.table()
    assert any("not recorded" in n and "eval step" in n for n in free.notes)
    every = row(free, "checkpoint every").peak_bytes
    assert every < free.plain_peak_bytes
    budget = (free.plain_peak_bytes + every) // 2
    a = memfit.advise(model, ids, ids, loss_fn=loss_fn, optimizer="adam", budget=budget)
    assert a.plan.found and a.plan.strategy.checkpoint and a.plan.peak_bytes <= budget
    assert not a.native.plan.verified
    assert "meta, unverified" in a.table()
    assert any("the plan is unverified" in n for n in a.notes)
    assert all(p.is_meta for p in model.parameters())  # nothing moved off meta


def test_cards_given_as_one_string_are_refused_saying_to_pass_a_list():
    # Guards against what was: cards="8GiB" was read letter by letter ("cannot read 'G' as a size").
    model = blocks_mlp()
    x, y = mlp_batch(8)
    with pytest.raises(TypeError, match=r"^\[advise\] cards is a list of card budgets, got "
                       r"the str '8GiB': pass cards=\['8GiB'\]"):
        memfit.advise(model, x, y, cards="8GiB")


def test_a_plan_applies_its_checkpointing_to_the_peft_copy_a_setting_made():
    # Guards against what was: after advice.setting(...).apply wrapped the model in
    # LoRA, advice.apply said "the model has no block 'model.layers.0'".
    pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from types import SimpleNamespace

    from memfit.plan.strategies import Strategy
    from memfit.plan.strategies.advice import Advice

    model = peft.get_peft_model(tiny_llama(use_cache=False),
                                peft.LoraConfig(r=2, target_modules=["q_proj"]))
    advice = Advice(chain=SimpleNamespace(block_paths=["model.layers.0", "model.layers.1"]),
                    plan=SimpleNamespace(found=True, strategy=Strategy(checkpoint=(0, 1))))
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    layer = model.get_base_model().model.layers[0]
    assert "forward" not in layer.__dict__
    with advice.apply(model) as applied:
        assert applied is model
        assert "forward" in layer.__dict__  # checkpointed
        applied(input_ids=ids, labels=ids).loss.backward()
    assert "forward" not in layer.__dict__
    with pytest.raises(ValueError, match=r"has no block 'model.layers.0' to checkpoint"):
        advice.apply(torch.nn.Linear(2, 2))


def test_a_checkpointed_hf_layer_does_not_append_to_the_kv_cache_again_in_backward():
    # With use_cache=True (Llama's default) a checkpointed layer's recompute
    # must not append its keys and values to the cache a second time.
    pytest.importorskip("transformers")
    from memfit.plan.strategies.checkpoint import checkpointed

    model = tiny_llama(dtype=torch.float64).train()
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, labels=ids).loss.backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with checkpointed(list(model.model.layers)):
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    assert [tuple(layer.keys.shape) for layer in out.past_key_values.layers] == [(2, 1, 9, 16)] * 2
    for g, want in zip((p.grad for p in model.parameters()), plain):
        assert torch.allclose(g, want, rtol=1e-10, atol=1e-12)


def test_advise_names_a_training_kv_cache_with_its_bytes():
    # Guards against what was: with use_cache=True (Llama-3's own config) neither
    # advise nor the doctor named the cache or its bytes.
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    model = tiny_llama("meta").train()
    ids = torch.zeros(2, 9, dtype=torch.long, device="meta")
    advice = memfit.advise(model, {"input_ids": ids, "labels": ids},
                           loss_fn=lambda out: out.loss,
                           optimizer=torch.optim.SGD(model.parameters(), lr=0.1), mode="meta",
                           repeats=0)
    # 2 layers x keys and values x 2 x 9 tokens x 1 head x 16 x 4 bytes.
    assert any(n.startswith("the model's config has use_cache=True: a training forward keeps "
                            "a KV cache of 4.50 KiB at 2 x 9 tokens") for n in advice.notes), \
        advice.notes
    model.config.use_cache = False
    from memfit.plan.strategies.llm_settings import kv_cache_notes
    assert kv_cache_notes(model, {"input_ids": ids}) == []


def test_advise_rows_carry_the_kv_cache_each_step_keeps():
    # Guards against what was: only a note named the training KV cache; the
    # rows, plans and JSON now carry each step's cache bytes.
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from memfit.plan.strategies.llm_settings import llm_settings

    model = tiny_llama("meta").train()
    ids = torch.zeros(4, 9, dtype=torch.long, device="meta")
    proposed, _ = llm_settings(model)
    settings = [st for st in proposed if st.label in ("HF gradient checkpointing", "bf16 weights")]
    advice = memfit.advise(model, {"input_ids": ids, "labels": ids}, loss_fn=lambda out: out.loss,
                           optimizer=torch.optim.SGD(model.parameters(), lr=0.1), repeats=0,
                           settings=settings, cards=["1GiB", 240_000])
    # 2 layers x keys and values x 4 x 9 tokens x 1 head x 16 x 4 bytes.
    whole = 2 * 2 * 4 * 9 * 16 * 4
    kv = {r.name: r.kv_cache_bytes for r in advice.rows}
    assert kv["plain (zero_grad set_to_none)"] == whole
    assert kv["checkpoint every block (2 of 2)"] == whole  # memfit's checkpointing keeps it
    assert kv["HF gradient checkpointing"] == 0  # HF turns the cache off under its own
    assert kv["bf16 weights"] == whole // 2
    doc = json.loads(advice.to_json())
    assert [s["kv_cache_bytes"] for s in doc["strategies"]] == [r.kv_cache_bytes
                                                               for r in advice.rows]
    tight, roomy = advice.cards
    assert roomy.plan.found and roomy.plan.micro_batch == 0 and roomy.plan.kv_cache_bytes == whole
    # A micro-batch keeps the cache of its own samples.
    assert tight.plan.found and tight.plan.strategy.setting is None, advice.cards_table()
    assert tight.plan.kv_cache_bytes == whole * tight.plan.micro_batch // 4 < whole
    assert [c["kv_cache_bytes"] for c in doc["cards"]] == [tight.plan.kv_cache_bytes, whole]
