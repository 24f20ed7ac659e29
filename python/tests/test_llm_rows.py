"""The rows fine-tuning people choose: the chunked loss, 8-bit AdamW
and 4-bit QLoRA (torchao) are advise rows, each equal byte for byte to
memfit.profile of the changed copy on a tiny Llama on the CPU; NF4 weights
take the bytes of the closed form, scales included; the cards table plans
each card from the same recordings."""

import pytest
import torch

import memfit
from memfit.plan.strategies.llm_settings import llm_settings, materialize, user_optimizer_on
from memfit.plan.strategies.quantized import (nf4_bytes, to_nf4_linears, torchao_available,
                                              adam8bit_state_bytes, adamw8bit)

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
if not torchao_available():
    pytest.skip("torchao does not import", allow_module_level=True)

# Projections of 256 x 256, 256 x 128 and 256 x 512: multiples of 64 x 256,
# so torchao quantizes each.
CONFIG = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              use_cache=False)
NEW = ("chunked loss", "AdamW 8-bit", "QLoRA")


def tiny_llama(device="cpu", dtype=torch.float32, config=CONFIG):
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    return model.to(dtype)


def inputs(device="cpu", b=2, t=64):
    ids = torch.randint(0, CONFIG["vocab_size"], (b, t), device=device,
                        generator=None if device == "meta" else torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids}


def loss(out):
    return out.loss


@pytest.fixture(scope="module")
def advised():
    model = tiny_llama()
    x = inputs()
    # The chunk a 16 MiB budget gives (64 tokens): 2 chunks of the 128 tokens.
    settings, _ = llm_settings(model, budget_bytes=16 * 2**20)
    advice = memfit.advise(model, x, loss_fn=loss, optimizer=torch.optim.AdamW(model.parameters()),
                           repeats=0, allow_approximate=True, settings=settings)
    return model, x, advice


@pytest.mark.slow  # the advised fixture: 25 s on 2 busy cores
def test_the_new_settings_are_rows(advised):
    _, _, advice = advised
    names = [r.name for r in advice.rows if r.kind == "setting"]
    for new in NEW:
        assert any(new in n for n in names), (new, names)
    chunked = next(r for r in advice.rows if r.name.startswith("chunked loss"))
    assert chunked.exact  # same gradients: the plan may use it without allow_approximate
    assert chunked.name == "chunked loss (64 tokens a chunk)"
    _, notes = llm_settings(tiny_llama("meta"))
    assert any("paged" in n and "CUDA" in n for n in notes)


@pytest.mark.slow  # the advised fixture: 25 s on 2 busy cores
def test_each_new_row_equals_memfit_profile_of_the_changed_copy(advised):
    model, x, advice = advised
    user = torch.optim.AdamW(model.parameters())
    checked = 0
    for row in advice.rows:
        if row.kind != "setting" or not any(n in row.name for n in NEW):
            continue
        st = advice.setting(row.name)
        m, _ = materialize(model, st)
        opt = st.optimizer(m, user) if st.optimizer else user_optimizer_on(m, user)
        r = memfit.profile(m, x, loss_fn=loss, optimizer=opt)
        assert r.budget_peak_bytes == row.peak_bytes, row.name
        checked += 1
    assert checked == 4  # chunked; AdamW 8-bit; QLoRA; QLoRA with the chunked loss


@pytest.mark.slow  # the advised fixture: 25 s on 2 busy cores
def test_the_rows_order_what_each_setting_saves(advised):
    _, _, advice = advised
    peak = {r.name: r.peak_bytes for r in advice.rows}
    plain = advice.plain_peak_bytes
    chunked = next(n for n in peak if n.startswith("chunked loss"))
    qlora = next(n for n in peak if n.startswith("QLoRA") and "chunked" not in n)
    both = next(n for n in peak if n.startswith("QLoRA") and "chunked" in n)
    lora = next(n for n in peak if "LoRA r=16" in n and "QLoRA" not in n)
    # The chunked loss never adds bytes. Full fine-tuning peaks in AdamW's
    # step, where no logits live. QLoRA on this model peaks in layer 1's
    # forward, at the temporaries of dequantizing an NF4 weight, before the
    # head: its logits (128 tokens x 1024) are smaller than those, so the
    # chunked loss leaves both peaks where they are (measured: equal).
    # test_the_chunked_loss_lowers_qlora_where_the_logits_peak has a model
    # whose logits do set the peak.
    assert peak[chunked] <= plain
    assert peak[both] <= peak[qlora]
    # (QLoRA's 4-bit weights win on a large model; on this tiny one its
    # adapters on 7 projections and the dequantized weight of each matmul
    # weigh more than LoRA r=16 on two: not compared.)
    assert lora


def test_the_chunked_loss_lowers_qlora_where_the_logits_peak():
    # One layer and a vocabulary of 4096: QLoRA's peak is in backward, with
    # the fp32 logits' gradients (128 tokens x 4096 x 4 B, 2 MiB each) live.
    # The chunked loss holds one chunk's (64 tokens) at a time instead: it
    # saves at least the fp32 logits of the other tokens.
    model = tiny_llama(config=dict(CONFIG, vocab_size=4096, num_hidden_layers=1))
    x = inputs()
    settings, _ = llm_settings(model, budget_bytes=16 * 2**20)
    user = torch.optim.AdamW(model.parameters())
    peak = {}
    for st in settings:
        if st.label.startswith("QLoRA"):
            m, _ = materialize(model, st)
            r = memfit.profile(m, x, loss_fn=loss, optimizer=user_optimizer_on(m, user))
            peak["chunked" in st.label] = r.budget_peak_bytes
            if "chunked" not in st.label:
                assert r.peak_phase == "backward"
    tokens, chunk, vocab = 128, 64, 4096
    assert peak[False] - peak[True] >= (tokens - chunk) * vocab * 4, peak


def test_nf4_weights_take_the_closed_form_bytes():
    model = tiny_llama(dtype=torch.bfloat16)
    sizes = {n: m.weight.numel() for n, m in model.named_modules()
             if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1].endswith("proj")}
    rest = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
               if n.rsplit(".", 1)[0] not in sizes)
    rest += sum(b.numel() * b.element_size() for b in model.buffers())
    assert to_nf4_linears(model) == len(sizes) == 14
    # The NF4 tensors' own storages: codes, scales, factors, mean, levels.
    held = 0
    for n, m in model.named_modules():
        if n in sizes:
            names, _ = m.weight.__tensor_flatten__()
            held += sum(getattr(m.weight, k).untyped_storage().nbytes() for k in names)
    closed = sum(nf4_bytes(s) for s in sizes.values())
    assert held == closed
    # 256 x 256: 32768 B of codes, 1024 int8 scales, 4 factors x 2 B, mean, 16 levels.
    assert nf4_bytes(256 * 256) == 32768 + 1024 + 8 + 2 + 32
    # memfit records the same bytes when the model's tensors come onto the device.
    r = memfit.profile(model, inputs(), loss_fn=loss, optimizer=None)
    params = next(p for p in r.phases if p["name"] == "parameters")
    assert params["live_bytes_after"] == closed + rest


def test_8bit_adamw_state_is_the_closed_form():
    p = torch.nn.Parameter(torch.randn(512, 256))
    small = torch.nn.Parameter(torch.randn(100))
    opt = adamw8bit([p, small])
    p.grad, small.grad = torch.randn_like(p), torch.randn_like(small)
    opt.step()

    def held(state):
        total = 0
        for v in state.values():
            if hasattr(v, "__tensor_flatten__"):
                names, _ = v.__tensor_flatten__()
                total += sum(getattr(v, k).untyped_storage().nbytes() for k in names)
            else:
                total += v.untyped_storage().nbytes()
        return total

    assert held(opt.state[p]) == adam8bit_state_bytes(p.numel())
    assert held(opt.state[small]) == adam8bit_state_bytes(small.numel()) == 4 * 200 + 4


def test_setting_labels_in_the_planners_order():
    settings, notes = llm_settings(tiny_llama("meta"), budget_bytes=64 * 2**20)
    labels = [s.label for s in settings]
    assert labels[:2] == ["HF gradient checkpointing", "chunked loss (256 tokens a chunk)"]
    assert labels.index("bf16 weights, AdamW 8-bit (torchao)") < labels.index(
        "bf16 weights, Adafactor")
    assert labels[-2:] == ["QLoRA r=16 (NF4 via torchao, 7 projections)",
                           "QLoRA r=16 (NF4 via torchao, 7 projections), chunked loss "
                           "(256 tokens a chunk)"]


def test_nf4_on_meta_is_to_nf4_of_each_weight():
    # See Note [NF4 on meta]: one to_nf4 a shape, the others shaped as it.
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    model = tiny_llama("meta", torch.bfloat16)
    assert to_nf4_linears(model) == 14
    storages = set()
    for n, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and n.endswith("proj"):
            got = m.weight
            want = to_nf4(torch.empty(got.shape, dtype=got.dtype, device="meta"), 64, 256)
            names, ctx = got.__tensor_flatten__()
            assert (names, ctx) == want.__tensor_flatten__()
            for k in names:
                a, b = getattr(got, k), getattr(want, k)
                assert (a.shape, a.stride(), a.dtype, a.untyped_storage().nbytes()) == (
                    b.shape, b.stride(), b.dtype, b.untyped_storage().nbytes()), (n, k)
                storages.add(id(a))
    assert len(storages) == 14 * 5  # each weight its own tensors


def test_8bit_adamw_on_meta_records_the_same_step_with_repeated_slices_run_once(monkeypatch):
    # See Notes [Repeated slices on meta], [Replayed on meta]: 8 slices a weight.
    from memfit.plan.strategies import quantized

    monkeypatch.setattr(quantized, "SLICE", 8192)
    with torch.device("meta"):
        model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    x = torch.zeros(8, 256, device="meta")

    def recorded():
        opt = adamw8bit(model.parameters())
        r = memfit.profile(model, x, loss_fn=lambda out: out.sum(), optimizer=opt, mode="meta",
                           target_device="cuda")
        return ((r.peak_bytes, r.cuda.peak_reserved,
                 [(p["name"], p["peak_bytes"]) for p in r.phases]),
                [e[:2] for e in r.timeline.events()])

    once, fewer = recorded()
    monkeypatch.setattr(type(adamw8bit([torch.nn.Parameter(torch.zeros(1))])), "_seen_on_meta",
                        lambda self, p, n, state: False)
    replayed, events = recorded()
    assert replayed == once
    assert len(fewer) < len(events) / 5  # the repeated slices did not run
    monkeypatch.setattr(quantized, "replayed_on_meta", lambda key, run, result=None: run())
    every, run = recorded()
    assert every == once
    assert events == run  # the replayed slices allocate and free as torchao's


def test_nf4_dequantization_on_meta_replays_torchaos_allocations():
    # See Note [NF4 on meta]: the second dequantization of a shape replays the first's.
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    from memfit import _memfit

    def events(f):
        rec = _memfit.Recorder()
        rec.only_device("meta")
        rec.drop_meta_kernel_intermediates()
        out = f()
        del out
        rec.stop()
        ids = {}
        return [(kind, n, ids.setdefault(i, len(ids))) for kind, n, i, *_ in
                rec.timeline.events()]

    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(1024, 256))
    model.to(torch.bfloat16)
    for name in ("0", "1"):
        assert to_nf4_linears(model, (name,)) == 1
        ours = model.get_submodule(name).weight
        shape = ours.shape
        torchaos = to_nf4(torch.empty(shape, dtype=torch.bfloat16, device="meta"), 64, 256)
        assert type(ours) is not type(torchaos)  # memfit's, replaying on meta
        def step(w):
            x = torch.empty(3, shape[1], dtype=torch.bfloat16, device="meta", requires_grad=True)
            y = torch.nn.functional.linear(x, w)
            y.sum().backward()
            return y

        want = events(lambda: step(torchaos))
        assert len(want) > 20
        assert events(lambda: step(ours)) == want  # recorded under a second Recorder
        assert events(lambda: step(ours)) == want  # replayed
        assert type(torch.nn.Parameter(ours, requires_grad=False)) is type(ours)
