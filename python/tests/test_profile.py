import collections
import json

import pytest
import torch

import memfit

pytestmark = pytest.mark.torch_api  # see python/tests/conftest.py

PARAMS_MLP = 669_706


def mlp():
    return torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(784, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )


def batch(n, shape=(28, 28), classes=10):
    g = torch.Generator().manual_seed(n)
    return torch.randn(n, *shape, generator=g), torch.randint(0, classes, (n,), generator=g)


def test_mlp_adam_parameters_gradients_and_state_are_exact():
    x, y = batch(64)
    r = memfit.profile(mlp(), x, y, optimizer="adam")
    cats = r.categories_at_peak
    assert r.parameter_bytes == 4 * PARAMS_MLP
    assert cats["parameter"] == 4 * PARAMS_MLP
    assert cats["gradient"] == 4 * PARAMS_MLP
    assert sum(cats.values()) == r.peak_bytes
    step1 = [p for p in r.phases if p["name"] == "optimizer_step" and p["iteration"] == 1][0]
    # Adam's exp_avg and exp_avg_sq, plus one 4-byte `step` tensor per parameter
    assert step1["delta_bytes"] == 2 * 4 * PARAMS_MLP + 6 * 4
    assert "Adam" in step1["note"]


def test_json_has_exactly_the_documented_keys():
    x, y = batch(8)
    doc = json.loads(memfit.profile(mlp(), x, y, optimizer="sgd").to_json())
    assert set(doc) == {
        "model", "batch", "optimizer", "mode", "peak_bytes", "phases",
        "categories_at_peak", "modules", "truth",
    }
    assert doc["batch"] == 8
    assert set(doc["phases"][0]) == {
        "name", "iteration", "live_bytes_after", "delta_bytes", "peak_bytes", "note",
    }
    # ReLU outputs are what the MLP saves (the Linear outputs die in forward),
    # labelled as track() labels them (path and class)
    assert {m["path"] for m in doc["modules"]} >= {"2 (ReLU)", "4 (ReLU)"}


def test_profile_leaves_model_gradients_and_optimizer_as_they_were():
    model = mlp()
    opt = torch.optim.Adam(model.parameters())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = batch(4)
    memfit.profile(model, x, y, optimizer=opt)
    memfit.profile(model, x, y, optimizer=opt, mode="meta")
    for k, v in model.state_dict().items():
        assert v.device.type == "cpu"
        assert torch.equal(v, before[k])
    assert all(p.grad is None for p in model.parameters())
    assert len(opt.state) == 0


def test_svg_is_written(tmp_path):
    x, y = batch(4)
    r = memfit.profile(mlp(), x, y, optimizer="adam")
    path = tmp_path / "t.svg"
    r.save_svg(str(path))
    text = path.read_text()
    assert text.startswith("<svg") and text.rstrip().endswith("</svg>")
    assert "peak" in text


def _outputs(report):
    """Sizes of allocations that outlive their op, per phase and iteration."""
    out = collections.defaultdict(collections.Counter)
    for kind, size, _, _, cat, phase, _, _ in report.timeline.events():
        if kind == "alloc" and cat != "temporary":
            out[phase][size] += 1
    return out


@pytest.mark.parametrize(
    "make",
    [
        mlp,
        lambda: torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2
        ),
    ],
    ids=["mlp", "transformer"],
)
def test_meta_and_cpu_agree_on_every_output_byte(make, request):
    if request.node.callspec.id == "transformer":
        # Seen on torch 2.13: in the loss phase the CPU keeps two 3072-byte
        # outputs where meta keeps the two 4-byte losses (mse_loss's CPU
        # path differs from its meta kernel). Open: not diagnosed yet.
        request.applymarker(pytest.mark.xfail(
            strict=True, reason="torch 2.13's CPU mse_loss outputs differ from its meta kernel's"))
    torch.manual_seed(0)
    model = make()
    if isinstance(model, torch.nn.Sequential):
        x, y = batch(4)
        loss = None
    else:
        x, y = torch.randn(4, 6, 32), torch.randn(4, 6, 32)
        loss = torch.nn.functional.mse_loss
    cpu = memfit.profile(model, x, y, loss_fn=loss, optimizer="adam")
    meta = memfit.profile(model, x, y, loss_fn=loss, optimizer="adam", mode="meta")
    assert meta.mode == "meta", meta.notes
    # Adam's 4-byte step counts live on the host: the CPU run holds them on
    # its device, meta mode (standing for a GPU) leaves them out.
    on_device = _outputs(cpu)
    on_device["optimizer_step"] -= collections.Counter({4: len(list(model.parameters()))})
    assert _outputs(meta) == on_device


def test_meta_falls_back_to_cpu_and_says_so():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2))
    x, y = torch.randn(2, 3, 8, 8), torch.randint(0, 2, (2,))
    r = memfit.profile(model, x, y, mode="meta")
    if torch.__version__.startswith("1."):
        assert r.mode == "cpu"
        assert "fell back to cpu" in r.notes[0]
    assert r.peak_bytes > 0


@pytest.mark.parametrize(
    "name",
    ["resnet18", "mobilenet_v2"],
)
def test_torchvision_peak_at_256_predicted_within_2_percent(name):
    # torchvision imports only beside a torch it was built for (the pair
    # torch 2.14.1 + torchvision 0.29.1; not the CPU wheel make test uses).
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(num_classes=10)
    # 64x64 images keep the measured run at 256 quick on two CPU cores.
    small = torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,))
    prediction = memfit.profile(model, *small, optimizer="adam").prediction(256)
    big = torch.randn(256, 3, 64, 64), torch.randint(0, 10, (256,))
    measured = memfit.profile(model, *big, optimizer="adam").peak_bytes
    miss = abs(prediction.predicted_bytes - measured) / measured
    if prediction.affine:
        assert miss < 0.02, (prediction.text(), measured)
    else:
        # oneDNN's AVX-512 convolutions (not its AVX2 ones) change their
        # scratch with the batch: resnet18 at 256 came out 3.2% under its
        # prediction on an AMX Xeon. The prediction must then say it is
        # unsure, which is what find_batch_size verifies with a step.
        assert "not affine" in prediction.text(), (prediction.text(), measured)


def test_model_returning_a_dict_needs_a_loss_fn():
    class DictModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, x):
            return {"logits": self.fc(x)}

    x, y = torch.randn(3, 4), torch.randint(0, 2, (3,))
    with pytest.raises(ValueError, match="returned a dict"):
        memfit.profile(DictModel(), x, y)
    r = memfit.profile(
        DictModel(), x, y,
        loss_fn=lambda out, t: torch.nn.functional.cross_entropy(out["logits"], t),
    )
    assert r.peak_bytes > 0


def test_loss_that_is_not_a_scalar_is_refused():
    x, y = batch(4)
    with pytest.raises(ValueError, match="scalar"):
        memfit.profile(mlp(), x, y, loss_fn=lambda o, t: o)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_dim=3), "out of range"),
        (dict(optimizer="adagrad"), "unknown optimizer"),
        (dict(mode="gpu"), "mode must be"),
    ],
)
def test_bad_arguments_are_explained(kwargs, message):
    x, y = batch(4)
    with pytest.raises(ValueError, match=message):
        memfit.profile(mlp(), x, y, **kwargs)


def test_empty_batch_and_mismatched_target_are_refused():
    with pytest.raises(ValueError, match="empty"):
        memfit.profile(mlp(), torch.randn(0, 28, 28))
    with pytest.raises(ValueError, match="same samples"):
        memfit.profile(mlp(), torch.randn(4, 28, 28), torch.randint(0, 10, (3,)))


# -- Bad inputs refused before anything runs; the user's gradients left as they were --


def test_existing_gradients_are_left_exactly_as_they_were():
    """Not accumulated into (the same tensor objects, the same values), and
    no .grad appears on an input that had none."""
    model = mlp()
    x, y = batch(4)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    grads = [p.grad for p in model.parameters()]
    values = [g.clone() for g in grads]
    x.requires_grad_(True)
    memfit.profile(model, x, y, optimizer="sgd")
    memfit.find_batch_size(model, x, y, optimizer="sgd", budget="64MiB")
    assert all(p.grad is g for p, g in zip(model.parameters(), grads))
    assert all(torch.equal(g, v) for g, v in zip(grads, values))
    assert x.grad is None


def _scheduler(model):
    return torch.optim.lr_scheduler.StepLR(torch.optim.SGD(model.parameters(), lr=0.1), 1)


def _foreign(model):
    return torch.optim.SGD(mlp().parameters(), lr=0.1)  # another model's parameters




_ENTRY_POINTS = {
    "profile": lambda m, x, y, o: memfit.profile(m, x, y, optimizer=o),
    "find_batch_size": lambda m, x, y, o: memfit.find_batch_size(m, x, y, optimizer=o,
                                                                 budget="64MiB"),
    "auto_batch_size": lambda m, x, y, o: memfit.auto_batch_size(
        8, model=m, inputs=x, target=y, optimizer=o, budget="64MiB"),
    "advise": lambda m, x, y, o: memfit.advise(m, x, y, optimizer=o, repeats=1),
    "Trainer": lambda m, x, y, o: memfit.Trainer(m, o, torch.nn.CrossEntropyLoss()).step(x, y),
}


@pytest.mark.parametrize("entry", list(_ENTRY_POINTS))
@pytest.mark.parametrize("make, message", [
    (_scheduler, r"optimizer is a StepLR, a learning-rate scheduler.*scheduler\.optimizer"),
    (_foreign, r"the SGD optimizer holds none of the model's 6 trainable parameters.*"
               r"make it over model\.parameters\(\)"),
], ids=["scheduler", "foreign"])
def test_an_optimizer_that_cannot_step_the_model_is_refused_before_anything_runs(
        entry, make, message):
    model = mlp()
    calls = []
    model.register_forward_pre_hook(lambda m, i: calls.append(1))
    x, y = batch(4)
    with pytest.raises(ValueError, match=rf"^\[{entry}\] {message}"):
        _ENTRY_POINTS[entry](model, x, y, make(model))
    assert calls == []


class _NoGradForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(784, 10)

    def forward(self, x):
        with torch.no_grad():
            return self.fc(x.flatten(1))


def _frozen():
    model = mlp()
    model.requires_grad_(False)
    return model


@pytest.mark.parametrize("make, message", [
    (_frozen, r"every parameter of the model is frozen"),
    (_NoGradForward, r"the loss does not require grad.*torch.no_grad\(\)"),
], ids=["frozen", "no_grad"])
@pytest.mark.parametrize("mode", ["cpu", "meta"])
def test_a_step_with_nothing_to_train_says_why(make, message, mode):
    x, y = batch(4)
    with pytest.raises(ValueError, match=rf"^\[profile\] {message}"):
        memfit.profile(make(), x, y, optimizer="sgd", mode=mode)


def test_some_frozen_parameters_are_profiled_without_their_gradients():
    x, y = batch(4)
    full = memfit.profile(mlp(), x, y, optimizer="sgd").categories_at_peak["gradient"]
    model = mlp()
    model[1].requires_grad_(False)
    part = memfit.profile(model, x, y, optimizer="sgd").categories_at_peak["gradient"]
    assert full - part == 4 * sum(p.numel() for p in model[1].parameters())


def test_meta_inputs_in_cpu_mode_are_refused_naming_meta_mode():
    x, y = batch(4)
    with pytest.raises(ValueError, match=r"^\[profile\] the inputs are on the meta device.*"
                                         r"pass mode='meta'"):
        memfit.profile(mlp(), x.to("meta"), y.to("meta"))
    r = memfit.profile(mlp(), x.to("meta"), y.to("meta"), mode="meta")
    assert r.peak_bytes == memfit.profile(mlp(), x, y).peak_bytes


def test_a_list_of_inputs_is_passed_as_positional_arguments():
    class Pair(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(784, 10)

        def forward(self, a, b):
            return self.fc(a.flatten(1) + b.flatten(1))

    x, y = batch(4)
    as_list = memfit.profile(Pair(), [x, x], y)
    assert as_list.peak_bytes == memfit.profile(Pair(), (x, x), y).peak_bytes


@pytest.mark.parametrize("bad", [2.5, 8.0, True, "8", 0])
def test_a_batch_that_is_not_a_positive_int_is_refused(bad):
    x, y = batch(4)
    r = memfit.profile(mlp(), x, y)
    with pytest.raises(ValueError, match=r"^\[predict_peak_bytes\] batch must be an int >= 1"):
        r.predict_peak_bytes(bad)
    with pytest.raises(ValueError, match=r"^\[profile\] iterations must be an int >= 1"):
        memfit.profile(mlp(), x, y, iterations=bad)


# -- set_to_none=False: the gradients kept, as between accumulated micro-batches --


def test_zero_grad_in_place_keeps_the_gradients_through_the_next_iteration():
    x, y = batch(16)
    freed = memfit.profile(mlp(), x, y, optimizer="sgd")
    kept = memfit.profile(mlp(), x, y, optimizer="sgd", set_to_none=False)

    def after(r, name, it):
        return next(p for p in r.phases if p["name"] == name and p["iteration"] == it)

    grads = 4 * PARAMS_MLP
    # zero_grad frees the gradients, or zeroes them and keeps them.
    assert after(freed, "zero_grad", 1)["delta_bytes"] == -grads
    assert after(kept, "zero_grad", 1)["delta_bytes"] == 0
    # So the second iteration's forward runs beside them.
    assert (after(kept, "forward", 2)["live_bytes_after"]
            == after(freed, "forward", 2)["live_bytes_after"] + grads)
    assert kept.peak_bytes >= freed.peak_bytes
    assert any("set_to_none=False" in n for n in kept.notes)
    assert not any("set_to_none=False" in n for n in freed.notes)


def test_zero_grad_in_place_leaves_the_users_gradients_and_optimizer():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = batch(8)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    grads = [p.grad for p in model.parameters()]
    values = [g.clone() for g in grads]
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    memfit.profile(model, x, y, optimizer=opt, set_to_none=False)
    assert all(p.grad is g for p, g in zip(model.parameters(), grads))
    assert all(torch.equal(g, v) for g, v in zip(grads, values))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    assert all(torch.equal(opt.state[p]["momentum_buffer"], m)
               for p, m in zip(model.parameters(), momentum))


@pytest.mark.parametrize("bad", [None, 0, "no"])
def test_set_to_none_must_be_a_bool(bad):
    x, y = batch(4)
    with pytest.raises(ValueError, match=r"^\[profile\] set_to_none must be True or False"):
        memfit.profile(mlp(), x, y, set_to_none=bad)


def test_peak_model_is_the_model_prediction_probed():
    x, y = batch(8)
    r = memfit.profile(mlp(), x, y, optimizer="sgd")
    pm = r.peak_model()
    assert list(pm.probe_batches) == [2, 4, 8]  # b/4, b/2, b: toward the report's batch
    sure = r.prediction(512)  # grows the probes toward 512
    assert sure.probes[-1] >= 512 // 8
    grown = r.peak_model()  # the same probes, kept
    assert list(grown.probe_batches) == list(sure.probes)
    assert grown.predict(512) == sure.predicted_bytes


@pytest.mark.numerics
def test_a_profile_inside_autocast_measures_its_own_weight_casts_and_leaves_none():
    # See Note [A rehearsal inside the user's autocast].
    model = mlp()
    x, y = batch(8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fresh = memfit.profile(model, x, y, optimizer="sgd")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(x)  # autocast caches its casts of the weights
        warm = memfit.profile(model, x, y, optimizer="sgd")
        meta = memfit.profile(model, x, y, optimizer="sgd", mode="meta")
        got = model(x)  # casts of the weights themselves, not of a rehearsal's copies
    assert warm.peak_bytes == fresh.peak_bytes
    # Meta undercounts the CPU's autocast (5.15 vs 7.18 MiB): one CPU step
    # says so and the step is rehearsed there (Note [Meta mode checked
    # against the CPU's kernels]).
    assert meta.mode == "cpu" and meta.peak_bytes == fresh.peak_bytes and not got.is_meta
    assert torch.equal(got, want)


class CausalAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(32, 96), torch.nn.Linear(32, 10)

    def forward(self, x):
        n, length = x.shape[:2]
        q, k, v = self.qkv(x).view(n, length, 3, 2, 16).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(a.transpose(1, 2).reshape(n, length, 32).mean(1))


def _math_attention():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


@pytest.mark.numerics
@pytest.mark.parametrize("switch", ["bf16 autocast", "math attention"])
def test_a_reports_probes_run_under_the_switches_it_was_profiled_in(switch):
    # Profiled under bf16 autocast and asked outside it, the MLP's peak at
    # 512 came out 2.7% under its bf16 step (the one a bf16 loop runs);
    # profiled under sdpa_kernel(MATH) (the whole score matrix), attention's
    # at 16 5.6x under: the probes ran the caller's kernels. Each against a
    # report made and asked under the switch, and asked inside by one made
    # outside.
    if switch == "bf16 autocast":
        model, (x, y), at = mlp(), batch(8), 512
        entered = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    else:
        torch.manual_seed(0)
        model, x, y, at = CausalAttention(), torch.randn(2, 128, 32), torch.randint(0, 10, (2,)), 16
        entered = _math_attention
    with entered():
        inside = memfit.profile(model, x, y, optimizer="adam")
        want_inside = memfit.profile(model, x, y, optimizer="adam").predict_peak_bytes(at)
    outside = memfit.profile(model, x, y, optimizer="adam")
    want_outside = memfit.profile(model, x, y, optimizer="adam").predict_peak_bytes(at)
    assert want_inside != want_outside  # the test sees the switch at all
    assert inside.predict_peak_bytes(at) == want_inside
    with entered():
        assert outside.predict_peak_bytes(at) == want_outside


def test_a_profile_that_runs_out_of_memory_puts_everything_back():
    # See Note [A rehearsal that runs out of memory puts everything back].
    with memfit.simulated_device("16MiB"):
        torch.manual_seed(0)
        model = mlp()
        opt = torch.optim.Adam(model.parameters())
        x, y = batch(2048)  # on the device: 6.14 MiB of it
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        live = memfit._memfit.tracked_live_bytes("cpu")
        try:
            memfit.profile(model, x, y, optimizer=opt)
        except torch.cuda.OutOfMemoryError:
            pass
        else:
            pytest.fail("expected an out-of-memory error")
        assert len(opt.state) == 0
        assert all(p.grad is None for p in model.parameters())
        assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
        assert memfit._memfit.tracked_live_bytes("cpu") == live


def test_progress_says_each_phase_probe_and_verification():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    lines = []
    memfit.profile(model, x, y, optimizer="adam", progress=lines.append)
    phases = [line.split(": ", 1)[1] for line in lines if "record on cpu:" in line]
    assert phases[:3] == ["parameters", "inputs (iteration 1)", "forward (iteration 1)"]
    assert "zero_grad (iteration 2)" in phases and lines[-1].split("] ")[1].startswith("explain")
    lines.clear()
    fit = memfit.find_batch_size(model, x, y, optimizer="adam", budget="4MiB",
                                 progress=lines.append)
    said = [line.split("] ", 1)[1] for line in lines]
    assert sum(s.startswith("probe batch") for s in said) == sum(
        not p.verification for p in fit.probes)
    assert sum(s.startswith("verify batch") for s in said) == fit.trials
    with pytest.raises(ValueError, match="progress must be None, True or a callable"):
        memfit.profile(model, x, y, progress="yes")
