"""Models that live on the meta device (shapes without values) profiled in
meta mode: a model larger than the machine is planned with no real memory,
and its parameter, gradient and optimizer-state bytes are exact."""

import contextlib
import inspect
import os
import subprocess
import sys

import pytest
import torch

import memfit

pytestmark = pytest.mark.torch_api  # see python/tests/conftest.py


def meta_mlp():
    with torch.device("meta"):
        return torch.nn.Sequential(
            torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))


PARAMS = 784 * 512 + 512 + 512 * 10 + 10


def meta_batch(n):
    return (torch.empty(n, 784, device="meta"),
            torch.empty(n, dtype=torch.long, device="meta"))


def phase(report, name, iteration=1):
    return [p for p in report.phases if p["name"] == name and p["iteration"] == iteration][0]


def test_meta_model_with_adamw_has_exact_parameter_gradient_and_state_bytes():
    model = meta_mlp()
    x, y = meta_batch(32)
    r = memfit.profile(model, x, y, optimizer=torch.optim.AdamW(model.parameters()),
                       mode="meta")
    assert r.mode == "meta"
    assert r.parameter_bytes == 4 * PARAMS
    assert phase(r, "parameters")["delta_bytes"] == 4 * PARAMS
    assert phase(r, "inputs")["delta_bytes"] == 32 * 784 * 4 + 32 * 8
    # exp_avg and exp_avg_sq on the device; AdamW's step counts stay on the
    # host, as they do beside a GPU, and are not the device's bytes.
    assert phase(r, "optimizer_step")["delta_bytes"] == 2 * 4 * PARAMS
    assert phase(r, "optimizer_step", 2)["delta_bytes"] == 0
    assert phase(r, "zero_grad")["delta_bytes"] == -4 * PARAMS
    end = r.timeline.breakdown_after(len(r.timeline) - 1)["categories"]
    assert end["parameter"] == 4 * PARAMS
    assert end["optimizer_state"] == 2 * 4 * PARAMS
    assert end["gradient"] == 0


def test_meta_model_report_says_its_figures_are_unverified():
    model = meta_mlp()
    r = memfit.profile(model, *meta_batch(8), optimizer="adam", mode="meta")
    assert any(n.startswith("unverified: the inputs are on the meta device") for n in r.notes)
    real = memfit.profile(torch.nn.Linear(784, 10), torch.randn(8, 784),
                          torch.randint(0, 10, (8,)), mode="meta")
    assert not any("unverified" in n for n in real.notes)


def test_meta_model_and_optimizer_are_left_as_they_were():
    model = meta_mlp()
    opt = torch.optim.AdamW(model.parameters())
    data = [p.data for p in model.parameters()]
    memfit.profile(model, *meta_batch(8), optimizer=opt, mode="meta")
    assert all(p.is_meta and p.grad is None for p in model.parameters())
    assert all(p.data is d for p, d in zip(model.parameters(), data)) or all(
        p.data.shape == d.shape for p, d in zip(model.parameters(), data))
    assert opt.state_dict()["state"] == {}


def test_meta_model_refused_in_cpu_mode_with_the_fix():
    with pytest.raises(ValueError, match=r"^\[profile\] the model's parameters .* pass mode='meta'"):
        memfit.profile(meta_mlp(), torch.randn(8, 784), torch.randint(0, 10, (8,)), mode="cpu")


def test_meta_model_peak_equals_the_same_model_run_for_real_on_the_cpu():
    torch.manual_seed(0)
    real = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 10))
    x, y = torch.randn(16, 784), torch.randint(0, 10, (16,))
    cpu = memfit.profile(real, x, y, optimizer="sgd", mode="cpu")
    meta = memfit.profile(meta_mlp(), *meta_batch(16), optimizer="sgd", mode="meta")
    assert [p["live_bytes_after"] for p in meta.phases] == [
        p["live_bytes_after"] for p in cpu.phases]
    assert meta.peak_bytes == cpu.peak_bytes


def test_hf_llama_from_config_on_meta_profiles_whole_with_exact_model_states():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=256,
                                   intermediate_size=688, vocab_size=1000,
                                   num_attention_heads=4, num_key_value_heads=4,
                                   max_position_embeddings=128)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    n = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    ids = torch.zeros(2, 128, dtype=torch.long, device="meta")
    r = memfit.profile(model, {"input_ids": ids, "labels": ids}, loss_fn=lambda o: o.loss,
                       optimizer=torch.optim.AdamW(model.parameters()), mode="meta",
                       target_device="cuda")
    assert r.mode == "meta"
    assert phase(r, "parameters")["delta_bytes"] == 4 * n + buffers
    assert phase(r, "optimizer_step")["delta_bytes"] == 2 * 4 * n
    assert phase(r, "zero_grad")["delta_bytes"] == -4 * n
    assert r.peak_bytes > 4 * 4 * n


class LogSoftmaxHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 1000)

    def forward(self, x):
        return torch.log_softmax(self.fc(x), dim=-1)


def test_meta_kernel_intermediates_are_not_counted_so_every_phase_peak_equals_cpu():
    # torch's meta log_softmax is a Python decomposition (amax, sub, exp,
    # sum, log): its intermediates would add logits-sized tensors the CPU
    # kernel never holds. See Note [Meta kernels allocate only their outputs].
    torch.manual_seed(0)
    model = LogSoftmaxHead()
    x, y = torch.randn(32, 64), torch.randint(0, 1000, (32,))
    nll = torch.nn.functional.nll_loss
    cpu = memfit.profile(model, x, y, loss_fn=nll, optimizer="sgd", mode="cpu")
    with torch.device("meta"):
        meta_model = LogSoftmaxHead()
    meta = memfit.profile(meta_model, x.to("meta"), y.to("meta"), loss_fn=nll, optimizer="sgd",
                          mode="meta")
    assert meta.mode == "meta"
    assert [p["peak_bytes"] for p in meta.phases] == [p["peak_bytes"] for p in cpu.phases]
    assert [p["live_bytes_after"] for p in meta.phases] == [
        p["live_bytes_after"] for p in cpu.phases]


class Checks(torch.nn.Module):
    def __init__(self, read_a_number=False):
        super().__init__()
        self.fc = torch.nn.Linear(16, 4)
        self.read_a_number = read_a_number

    def forward(self, x):
        if self.read_a_number:
            x = x[: int(x.shape[0] * x.abs().max().item()) or 1]
        elif (x != 0).all():  # a data-dependent check, as transformers makes
            x = x * 1
        return self.fc(x)


def test_a_boolean_read_of_a_meta_tensor_answers_true_and_the_note_names_where():
    with torch.device("meta"):
        model = Checks()
    x = torch.empty(8, 16, device="meta")
    r = memfit.profile(model, x, loss_fn=lambda out: out.sum(), optimizer="sgd", mode="meta")
    assert r.mode == "meta"
    assert any(n.startswith("meta tensors have no values: 1 read(s) of the step answered "
                            "(checks True") and "test_meta_models.py:" in n for n in r.notes)


def _impl_as_in_2_11(impl):
    # allow_override=False by default: refuses to replace a Python kernel.
    def impl_2_11(self, op_name, fn, dispatch_key="", *, with_keyset=False,
                  allow_override=False):
        return impl(self, op_name, fn, dispatch_key, with_keyset=with_keyset,
                    allow_override=allow_override)
    return impl_2_11


def _impl_as_in_2_4(impl):
    # No allow_override in its signature: refuses while the key is in
    # _impls. (torch's own imports, dynamo's, pass it by keyword: kept.)
    def impl_2_4(self, op_name, fn, dispatch_key="", **torchs_own):
        return impl(self, op_name, fn, dispatch_key,
                    **{"allow_override": False, **torchs_own})
    return impl_2_4


@pytest.mark.parametrize("impl_as", [_impl_as_in_2_11, _impl_as_in_2_4], ids=["2.11", "2.4"])
def test_meta_mode_answers_reads_where_torch_refuses_to_replace_its_kernel(monkeypatch, impl_as):
    # torch registers a Python meta kernel for _local_scalar_dense (it
    # raises). Library.impl replaces it by default from torch 2.13; 2.11
    # refuses unless passed allow_override=True, 2.4 has no such argument.
    # This torch's impl made to act as theirs: meta mode must not fall back,
    # and torch's own kernel and its registry entry are back after.
    if "allow_override" not in inspect.signature(torch.library.Library.impl).parameters:
        pytest.skip("this torch's Library.impl is the oldest kind: meta mode meets it for real")
    monkeypatch.setattr(torch.library.Library, "impl", impl_as(torch.library.Library.impl))
    key = "aten/_local_scalar_dense/Meta"
    registered = key in torch.library._impls
    with torch.device("meta"):
        model = Checks()
    x = torch.empty(8, 16, device="meta")
    r = memfit.profile(model, x, loss_fn=lambda out: out.sum(), optimizer="sgd", mode="meta")
    assert r.mode == "meta"
    assert not any("meta mode unavailable" in n for n in r.notes), r.notes
    assert (key in torch.library._impls) == registered
    with pytest.raises(RuntimeError, match="cannot be called on meta tensors"):
        torch.ones(1, device="meta").item()


def test_a_number_read_of_a_meta_tensor_is_refused_naming_where():
    with torch.device("meta"):
        model = Checks(read_a_number=True)
    x = torch.empty(8, 16, device="meta")
    with pytest.raises(ValueError, match=r"^\[profile\] the step reads a torch.float32 value of "
                                         r"a meta tensor at test_meta_models.py:\d+"):
        memfit.profile(model, x, loss_fn=lambda out: out.sum(), optimizer="sgd", mode="meta")


class Attention(torch.nn.Module):
    def __init__(self, kv_heads=4):
        super().__init__()
        self.kv_heads = kv_heads
        self.q = torch.nn.Linear(64, 64)
        self.kv = torch.nn.Linear(64, 2 * 16 * kv_heads)

    def forward(self, x):
        b, t = x.shape[:2]
        q = self.q(x).view(b, t, 4, 16).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, self.kv_heads, 16).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=self.kv_heads != 4).sum()


@pytest.mark.parametrize("kv_heads", [4, 1], ids=["multi_head", "grouped_query"])
def test_attention_on_meta_saves_what_the_cpus_fused_kernel_saves(kv_heads):
    # Meta's math path would save the 4 x 4 x 128 x 128 attention weights
    # (and, grouped, the keys and values repeated per head); the CPU's flash
    # kernel saves its output and log-sum-exp. See Note [Which attention
    # kernel meta runs].
    torch.manual_seed(0)
    model = Attention(kv_heads)
    x = torch.randn(4, 128, 64)
    cpu = memfit.profile(model, x, optimizer="sgd", mode="cpu")
    with torch.device("meta"):
        meta_model = Attention(kv_heads)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    meta = memfit.profile(meta_model, x.to("meta"), optimizer="sgd", mode="meta")
    assert torch.nn.functional.scaled_dot_product_attention is sdpa  # put back
    assert [p["live_bytes_after"] for p in meta.phases] == [
        p["live_bytes_after"] for p in cpu.phases]
    # The CPU's flash kernels take workspaces of their own (36.5 KiB in the
    # forward, 192 KiB in the backward here) that no meta kernel knows of;
    # the 1 MiB of attention weights the math path would save is gone.
    for m, c in zip(meta.phases, cpu.phases):
        assert 0 <= c["peak_bytes"] - m["peak_bytes"] < 256 << 10, (m, c)


def test_meta_step_for_cuda_runs_the_optimizer_foreach_as_the_gpu_would():
    # AdamW left at foreach=None runs per tensor on meta and the CPU, foreach
    # on CUDA: its step's temporaries grow from the largest tensor's to all
    # parameters'. See Note [The optimizer a GPU would run].
    def run(target_device):
        model = meta_mlp()
        opt = torch.optim.AdamW(model.parameters())
        r = memfit.profile(model, *meta_batch(8), optimizer=opt, mode="meta",
                           target_device=target_device)
        assert all(g["foreach"] is None for g in opt.param_groups)  # put back
        step = phase(r, "optimizer_step", 2)
        return r, step["peak_bytes"] - step["live_bytes_after"]

    cpu_like, loop_temporaries = run("cpu")
    cuda_like, foreach_temporaries = run("cuda")
    assert loop_temporaries <= 2 * 4 * 784 * 512  # twice the largest weight
    assert foreach_temporaries >= 4 * PARAMS  # all parameters at once
    assert any("foreach" in n for n in cuda_like.notes)
    assert not any("foreach" in n for n in cpu_like.notes)


def test_adafactor_reads_its_scalars_on_meta_and_the_note_says_so():
    model = meta_mlp()
    r = memfit.profile(model, *meta_batch(8), optimizer=torch.optim.Adafactor(model.parameters()),
                       mode="meta")
    assert r.mode == "meta"
    assert any("torch/optim/_adafactor.py:" in n for n in r.notes)
    # factored second moments: a row and a column per matrix, a vector per bias
    rows_cols = (784 + 512) * 4 + 512 * 4 + (512 + 10) * 4 + 10 * 4
    step1 = phase(r, "optimizer_step")
    assert step1["delta_bytes"] == rows_cols


def meta_kernel_of(op):
    """The first (active) Meta line of the dispatcher's table for `op`."""
    return [line for line in torch._C._dispatch_dump(op).splitlines()
            if line.startswith("Meta")][0]


def test_meta_mode_runs_torchs_cpp_kernels_and_puts_the_python_ones_back():
    # See Note [Native meta kernels] (python/src/bind_native_meta.cpp).
    before = meta_kernel_of("aten::mul.Tensor")
    assert "_meta_registrations.py" in before  # torch's Python kernel
    during = []

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 4)

        def forward(self, x):
            during.append(meta_kernel_of("aten::mul.Tensor"))
            return self.fc(x * 2.0)

    with torch.device("meta"):
        model = Probe()
    memfit.profile(model, torch.empty(8, 16, device="meta"), loss_fn=lambda out: out.sum(),
                   optimizer="adam", mode="meta")
    assert during and all("bind_native_meta.cpp" in k for k in during)
    assert meta_kernel_of("aten::mul.Tensor") == before


def test_every_native_meta_kernel_registers_on_the_pinned_torch():
    # On another torch an op may be missing or differ: it is skipped (torch's
    # Python kernel answers it). On the torch CI pins, none is.
    with memfit._memfit.NativeMetaKernels() as k:
        assert k.is_open and k.skipped == []
    assert not k.is_open


def test_a_gpt_recorded_on_meta_runs_none_of_torchs_python_meta_kernels():
    # Those for arange, layer norm, the causal mask and the loss call
    # torch._check or run through torch._refs, and the first such call imports
    # sympy and torch._dynamo: 1.5 s, more than the rest of the recording
    # (Note [Native meta kernels]). A fresh process: other tests import them.
    code = ("import sys, memfit\n"
            "memfit._memfit.run_cli(['profile', '--model', 'gpt', '--batch', '2', "
            "'--mode', 'meta', '--json'])\n"
            "print([m for m in ('sympy', 'torch._dynamo') if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-500:]


def test_meta_kernels_are_put_back_when_the_step_raises():
    before = meta_kernel_of("aten::add.Tensor")
    with torch.device("meta"):
        model = Checks(read_a_number=True)
    with pytest.raises(ValueError):
        memfit.profile(model, torch.empty(8, 16, device="meta"),
                       loss_fn=lambda out: out.sum(), optimizer="sgd", mode="meta")
    assert meta_kernel_of("aten::add.Tensor") == before


def hf_configs(t):
    return {
        "llama": (t.LlamaConfig(num_hidden_layers=2, hidden_size=128, intermediate_size=320,
                                num_attention_heads=4, num_key_value_heads=2, vocab_size=500,
                                max_position_embeddings=64, use_cache=False),
                  t.LlamaForCausalLM),
        "gpt2": (t.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=500, n_positions=64,
                              bos_token_id=0, eos_token_id=0, use_cache=False),
                 t.GPT2LMHeadModel),
        "bert": (t.BertConfig(num_hidden_layers=2, hidden_size=128, intermediate_size=512,
                              num_attention_heads=4, vocab_size=500,
                              max_position_embeddings=64), t.BertForMaskedLM),
        "t5": (t.T5Config(num_layers=2, num_decoder_layers=2, d_model=128, d_ff=512,
                          num_heads=4, d_kv=32, vocab_size=500, decoder_start_token_id=0,
                          pad_token_id=0, use_cache=False), t.T5ForConditionalGeneration),
    }


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert", "t5"])
def test_cpp_meta_kernels_give_the_report_pythons_give(name, monkeypatch):
    # The C++ kernels are the structured kernels' own meta functions: every
    # phase's peak and live bytes, both iterations, are the ones torch's
    # Python meta kernels give, for a card's step too (foreach, reserve).
    transformers = pytest.importorskip("transformers")
    cfg, cls = hf_configs(transformers)[name]

    def run():
        with torch.device("meta"):
            model = cls(cfg)
        ids = torch.zeros(2, 64, dtype=torch.long, device="meta")
        r = memfit.profile(model, {"input_ids": ids, "labels": ids}, loss_fn=lambda o: o.loss,
                           optimizer=torch.optim.AdamW(model.parameters()), mode="meta",
                           target_device="cuda")
        assert r.mode == "meta", r.notes
        return ([(p["name"], p["peak_bytes"], p["live_bytes_after"]) for p in r.phases],
                r.budget_peak_bytes)

    native = run()
    monkeypatch.setattr(memfit._step.meta_reads._memfit, "NativeMetaKernels", contextlib.nullcontext)
    python = run()
    assert native == python
