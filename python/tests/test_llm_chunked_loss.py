"""The chunked linear + cross-entropy loss: its loss and
gradients equal the plain loss's, alone and applied to HF causal LMs
(Llama, GPT-2 with its tied head), with ignored labels and the causal
shift; the logits are never returned whole."""

import pytest
import torch
import torch.nn.functional as F

import memfit
from memfit.plan.strategies.chunked_loss import chunk_tokens_for

transformers = pytest.importorskip("transformers")


def problem(dtype, n=37, h=16, v=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, dtype=dtype, generator=g).requires_grad_()
    weight = torch.randn(v, h, dtype=dtype, generator=g).requires_grad_()
    bias = torch.randn(v, dtype=dtype, generator=g).requires_grad_()
    target = torch.randint(0, v, (n,), generator=g)
    target[::5] = -100
    return hidden, weight, bias, target


def plain(hidden, weight, bias, target, reduction="mean"):
    z = F.linear(hidden, weight, bias)
    return F.cross_entropy(z if z.dtype == torch.float64 else z.float(), target,
                           reduction=reduction)


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


# Note [How far the chunked loss may be from the plain one]
# Per token both compute the same logsumexp - z[t]; what differs is the order
# of sums: the loss over n tokens (chunk by chunk), the head's weight and bias
# gradients over n tokens (one addmm per chunk, not one GEMM), and a GEMM's
# blocking of the sum over the V classes for the hidden gradient when its row
# count changes. Two orders of a sum of m terms differ by at most
# 2 (m - 1) u sum|terms|, and sum|terms| / max|result| (the cancellation) is
# measured at most 1.45 in problem() (n = 37, V = 50): 2 * 50 * 1.5 = 150 u.
def head_tolerance(dtype):
    return 150 * {torch.float64: 2.0**-53, torch.float32: 2.0**-24}[dtype]


# The HF models run in float64 and only rounding differs, the head's sums
# (above: V = 97 classes, <= 30 tokens, ~300 u) carried through two layers'
# backward; 1024 u = 2^-43 leaves a factor 3 for that. Measured at most 7.7 u
# (gpt2's gradients) on both AMX and AVX2 oneDNN.
HF_TOLERANCE = 2.0**-43


def fp64_loss(model, ids, labels):
    """The fp64 model's causal loss from its fp64 logits, shifted as HF shifts
    (HF's own loss upcasts the logits to fp32, fp64 ones too)."""
    logits = model(input_ids=ids).logits
    assert logits.dtype == torch.float64
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())


@pytest.mark.numerics
@pytest.mark.parametrize("chunk", [1, 7, 16, 37, 1000])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_chunked_loss_and_gradients_equal_the_plain_loss_in_fp64(chunk, reduction):
    hidden, weight, bias, target = problem(torch.float64)
    ref = plain(hidden, weight, bias, target, reduction)
    grads = torch.autograd.grad(ref, (hidden, weight, bias))
    out = memfit.chunked_linear_cross_entropy(hidden, weight, target, bias, chunk_tokens=chunk,
                                              reduction=reduction)
    got = torch.autograd.grad(out, (hidden, weight, bias))
    # See Note [How far the chunked loss may be from the plain one]: 150 u;
    # measured at most 2.1 u (loss) and 5.4 u (gradients) on AMX and AVX2.
    tol = head_tolerance(torch.float64)
    assert abs(out.item() - ref.item()) <= tol * abs(ref.item())
    for g, r in zip(got, grads):
        assert rel(g, r) <= tol
    # Ignored tokens get no gradient at all.
    assert torch.all(got[0][target == -100] == 0)


def test_chunked_loss_in_fp32_is_within_a_few_ulps_of_the_sum():
    # fp32: see Note [How far the chunked loss may be from the plain one],
    # 150 u = 8.9e-6; measured 0 (loss) and at most 7.4 u (the bias's
    # gradient) on AMX and AVX2. Any real error (a wrong shift or a lost
    # chunk) moves the loss by > 1%.
    hidden, weight, bias, target = problem(torch.float32)
    ref = plain(hidden, weight, bias, target)
    grads = torch.autograd.grad(ref, (hidden, weight, bias))
    out = memfit.chunked_linear_cross_entropy(hidden, weight, target, bias, chunk_tokens=8)
    got = torch.autograd.grad(out, (hidden, weight, bias))
    assert out.dtype == torch.float32
    tol = head_tolerance(torch.float32)
    assert abs(out.item() - ref.item()) <= tol * abs(ref.item())
    for g, r in zip(got, grads):
        assert rel(g, r) <= tol


@pytest.mark.numerics
def test_chunked_loss_in_bf16_is_as_close_to_fp64_as_the_plain_loss():
    # bf16: both compute the logits in bf16 and upcast (as HF does), so the
    # loss carries the same bf16 logits; the gradients round softmax - onehot
    # to bf16 for the matmuls, and the chunked head's gradient adds one bf16
    # rounding per chunk (5 here). Against the fp64 truth, the chunked error
    # stays within a small multiple of the plain step's own bf16 error.
    h64, w64, b64, target = problem(torch.float64)
    truth = plain(h64, w64, b64, target)
    true_grads = torch.autograd.grad(truth, (h64, w64, b64))
    leaves = [t.detach().to(torch.bfloat16).requires_grad_() for t in (h64, w64, b64)]
    ref = plain(*leaves, target)
    ref_grads = torch.autograd.grad(ref, leaves)
    out = memfit.chunked_linear_cross_entropy(leaves[0], leaves[1], target, leaves[2],
                                              chunk_tokens=8)
    got = torch.autograd.grad(out, leaves)
    assert abs(out.item() - truth.item()) <= 2 * abs(ref.item() - truth.item()) + 1e-6
    for g, r, t in zip(got, ref_grads, true_grads):
        assert rel(g.double(), t) <= 4 * max(rel(r.double(), t), 2 ** -8)


def tiny(kind, dtype=torch.float64):
    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=2, num_attention_heads=2,
                                       num_key_value_heads=1, max_position_embeddings=32)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=2,
                                      n_positions=32)
        model = transformers.GPT2LMHeadModel(cfg)
    return model.to(dtype).eval()  # no dropout: two forwards compute the same


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_hf_model_under_chunked_loss_has_the_plain_loss_and_gradients(kind):
    model = tiny(kind)
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[0, :4] = -100  # a prompt not trained on
    hf_loss = model(input_ids=ids, labels=labels).loss.item()
    loss = fp64_loss(model, ids, labels)
    # The shift is HF's: HF's fp32 loss rounds each logit once (u |z|), sums
    # V = 97 positive exponentials (<= 96 u of the sum, so 96 u in the log)
    # and averages 30 tokens (29 u); over a loss of ~4.6 that is < 64 u =
    # 2^-18. Measured 1.0 u (llama), 0.73 u (gpt2) on AMX and AVX2.
    assert abs(loss.item() - hf_loss) <= 2.0**-18 * abs(hf_loss)
    loss.backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    with memfit.chunked_loss(model, chunk_tokens=5):
        got = model(input_ids=ids, labels=labels)
        got.loss.backward()
        assert got.logits is None
        # Without labels it is the model as before: logits, no loss.
        assert model(input_ids=ids).logits.shape == (3, 11, 97)
    assert abs(got.loss.item() - loss.item()) <= HF_TOLERANCE * abs(loss.item())
    for n, p in model.named_parameters():
        assert rel(p.grad, ref[n]) <= HF_TOLERANCE, n
    # Taken off after the block: the plain logits again.
    assert model(input_ids=ids, labels=labels).logits is not None


def test_chunk_follows_the_budget():
    small = chunk_tokens_for(12 * 2**30, 128256)
    large = chunk_tokens_for(80 * 2**30, 128256)
    assert 64 <= small < large
    # A chunk's logits and their working copies stay within 1/16 of the budget.
    assert small * 128256 * 16 <= 12 * 2**30 / 16
    assert chunk_tokens_for(None, 128256) == 1024
    assert chunk_tokens_for(80 * 2**30, 128256, tokens=100) == 100


def test_a_model_without_a_linear_head_is_refused_in_one_line():
    with pytest.raises(ValueError, match="no nn.Linear lm_head"):
        with memfit.chunked_loss(torch.nn.Linear(3, 3)):
            pass


def test_nested_chunked_losses_put_back_the_outer_one():
    # Guards against what was: the inner block's end took the outer one's chunked loss off
    # too, and the outer's end then restored the wrong forward.
    model = tiny("gpt2")
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    plain = fp64_loss(model, ids, ids).item()
    with memfit.chunked_loss(model, chunk_tokens=4):
        outer = model.__dict__["forward"]
        with memfit.chunked_loss(model, chunk_tokens=3):
            assert model(input_ids=ids, labels=ids).logits is None
        assert model.__dict__["forward"] is outer
        got = model(input_ids=ids, labels=ids)
        assert got.logits is None
        assert abs(got.loss.item() - plain) <= HF_TOLERANCE * abs(plain)  # measured 0
    assert "forward" not in model.__dict__ and "forward" not in model.lm_head.__dict__
    assert model(input_ids=ids, labels=ids).logits is not None


def test_a_peft_model_gets_the_chunked_loss_on_the_model_it_wraps():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(tiny("llama"), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    plain = fp64_loss(model, ids, ids).item()
    with memfit.chunked_loss(model, chunk_tokens=4):
        got = model(input_ids=ids, labels=ids)
    assert got.logits is None
    assert abs(got.loss.item() - plain) <= HF_TOLERANCE * abs(plain)  # measured 1.8 u


def test_a_compiled_model_is_refused_naming_the_model_to_pass():
    model = torch.compile(tiny("gpt2"))
    with pytest.raises(ValueError, match=r"^\[chunked_loss\] GPT2LMHeadModel is compiled "
                       r"\(torch.compile\): put the chunked loss on the model before "
                       r"compiling it \(model._orig_mod\)"):
        with memfit.chunked_loss(model):
            pass


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(ignore_index=None), TypeError, r"ignore_index must be an int .* got NoneType None"),
    (dict(chunk_tokens="a"), TypeError, r"chunk_tokens must be a positive int .* got str 'a'"),
    (dict(chunk_tokens=0), ValueError, r"chunk_tokens must be a positive int .* got int 0"),
    (dict(target=torch.zeros(6)), TypeError, r"target must hold class indices, an integer "
                                            r"tensor, got torch.float32: pass target.long\(\)"),
    (dict(target=torch.tensor([0, 1, 20, 2, -100, 3])), ValueError,
     r"target 20 \(token 2\) is not a class of the head's 10 \(0..9\) nor ignore_index -100"),
    (dict(weight=torch.randn(10, 5)), ValueError, r"hidden states of 4 features but a head "
                                                  r"weight of shape \(10, 5\)"),
])
def test_bad_arguments_of_the_chunked_loss_are_refused_in_one_line(kwargs, error, message):
    args = dict(hidden=torch.randn(6, 4), weight=torch.randn(10, 4),
                target=torch.tensor([0, 1, 2, 3, 4, 5]))
    args.update(kwargs)
    with pytest.raises(error, match=r"^\[chunked_linear_cross_entropy\] " + message):
        memfit.chunked_linear_cross_entropy(**args)
