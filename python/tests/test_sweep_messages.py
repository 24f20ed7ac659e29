"""The sweep's unclear errors and silently wrong answers: each bad input gets one line that names the cause and what to do,
tagged with the user's call; nothing is guessed."""

import pytest
import torch
from torch import nn

import memfit


def one_line(e):
    text = str(e.value)
    assert "\n" not in text, text
    return text


def small():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def xy(n=8):
    return torch.randn(n, 8), torch.randint(0, 4, (n,))


def test_find_batch_size_with_a_zero_budget_blames_the_budget():
    m = small()
    x, y = xy()
    with pytest.raises(ValueError) as e:
        memfit.find_batch_size(m, x, y, optimizer="sgd", budget="0")
    text = one_line(e)
    assert text.startswith("[find_batch_size] the budget is 0 B"), text
    assert "margin" not in text


def test_profile_takes_cuda_workspace_as_a_size_string_before_recording():
    m = small()
    x, y = xy()
    r = memfit.profile(m, x, y, optimizer="sgd", target_device="cuda", cuda_workspace="8MiB")
    assert r.cuda.workspace_bytes == 8 << 20
    with pytest.raises(ValueError, match=r"^\[profile\] .*'16GiB'"):
        memfit.profile(m, x, y, target_device="cuda", cuda_workspace=[1])


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(split="no"), r"^\[Trainer\] split must be True or False, got 'no'$"),
    (dict(plan=1), r"^\[Trainer\] plan must be True or False, got 1$"),
    (dict(scaler="x"), r"^\[Trainer\] scaler must be a torch.amp.GradScaler \(or None\), got str"),
])
def test_trainer_refuses_bad_arguments_when_built(kwargs, pattern):
    m = small()
    with pytest.raises(ValueError, match=pattern) as e:
        memfit.Trainer(m, torch.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                       **kwargs)
    one_line(e)


class Returns(nn.Module):
    def __init__(self, what):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.what = what

    def forward(self, x):
        out = self.lin(x)
        if self.what == "dict":
            return {"logits": out}
        return None


@pytest.mark.parametrize("what,pattern", [
    ("dict", r"^\[Trainer.step\] loss_fn failed on the model's output, a dict "),
    ("None", r"^\[Trainer.step\] the model returned None: its forward must return its output"),
])
def test_trainer_says_when_the_model_output_is_no_tensor(what, pattern):
    m = Returns(what)
    x, y = xy()
    t = memfit.Trainer(m, torch.optim.SGD(m.parameters(), lr=0.1), nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match=pattern) as e:
        t.step(x, y)
    one_line(e)


def test_data_parallel_checks_the_model_is_the_one_profiled():  # D7
    m = small()
    x, y = xy()
    r = memfit.profile(m, x, y, optimizer="adam")
    with pytest.raises(ValueError, match=r"^\[data_parallel\] model= is not the model this "
                                         r"report profiled") as e:
        r.data_parallel(4, sharding="fsdp2", model=nn.ReLU())
    one_line(e)
    assert r.data_parallel(4, sharding="fsdp2", model=m)[0].peak_bytes > 0


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(cpu_offload="no"), r"^\[data_parallel\] cpu_offload must be True, False or a "
                             r"CPUOffloadPolicy, got 'no'$"),
    (dict(mixed_precision=torch.int8), r"^\[data_parallel\] mixed_precision's dtypes must be "
                                       r"floating point"),
])
def test_fsdp2_refuses_strings_that_read_as_true_and_impossible_dtypes(kwargs, pattern):  # D8
    m = small()
    x, y = xy()
    r = memfit.profile(m, x, y, optimizer="adam")
    with pytest.raises(ValueError, match=pattern):
        r.data_parallel(4, sharding="fsdp2", model=m, **kwargs)


def test_data_parallel_refuses_more_ranks_than_it_counts():
    m = small()
    x, y = xy()
    r = memfit.profile(m, x, y, optimizer="adam")
    with pytest.raises(ValueError, match=r"^\[data_parallel\] world_size 4611686018427387904 "
                                         r"is more ranks than memfit plans for") as e:
        r.data_parallel(2**62)
    one_line(e)


def test_find_batch_size_verify_must_be_a_bool():  # D8
    m = small()
    x, y = xy()
    with pytest.raises(ValueError, match=r"^\[find_batch_size\] verify must be True or False, "
                                         r"got 'no'$"):
        memfit.find_batch_size(m, x, y, optimizer="sgd", budget="1GiB", verify="no")


def test_a_stride_0_batch_too_large_to_copy_is_named():
    m = small()
    x = torch.randn(1, 8).expand(2**40, 8)
    with pytest.raises(ValueError) as e:
        memfit.profile(m, x, optimizer="sgd", loss_fn=lambda o: o.sum())
    text = one_line(e)
    assert text.startswith("[profile] the inputs hold 1099511627776 samples"), text
    assert "pass a smaller example batch" in text


def test_lazy_refused_arguments_install_no_hook():
    import subprocess
    import sys
    import os
    code = ("import torch, memfit\n"
            "before = torch.nn.Module.__call__\n"
            "try:\n    memfit.lazy([1, 2, 3])\nexcept TypeError:\n    pass\n"
            "assert torch.nn.Module.__call__ is before, 'hooked'\n"
            "memfit.lazy(torch.randn(4, 2))\n"
            "assert torch.nn.Module.__call__ is not before\n"
            "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.stdout.strip() == "ok", out.stderr
    assert "stays for the rest of the process" in memfit.lazy.__doc__


def test_find_batch_size_says_when_the_example_batch_verified_it():  # item 7
    m = small()
    x, y = xy(16)
    report = memfit.profile(m, x, y, optimizer="sgd")
    fit = memfit.find_batch_size(m, x, y, optimizer="sgd", budget=report.peak_bytes)
    assert fit.verified and fit.trials == 0 and fit.max_batch == 16, fit
    assert any(n.startswith("verified by a step already recorded: batch 16 was measured as a "
                            "probe (the example batch's own step") for n in fit.notes), fit.notes


class ForwardRaises(nn.Module):
    """A model whose step would fail: an argument refused before it is the
    argument's own error, said before anything is recorded."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))

    def forward(self, x):
        raise AssertionError("recorded before the arguments were read")


@pytest.mark.parametrize("kwargs,said", [
    (dict(margin="lots"), "[find_batch_size] margin: cannot read 'lots' as a size: use a byte "
                          "count (17179869184) or a number with KiB, MiB, GiB or TiB and no "
                          "space (16GiB)"),
    (dict(margin=-1), "[find_batch_size] margin: cannot use -1 as a size: it must be >= 0 "
                      "bytes (an int of bytes, or a string like '16GiB')"),
    # Was: "across_ranks is a process group but torch.distributed is not initialized".
    (dict(across_ranks="all"), "[find_batch_size] across_ranks must be True, False or a "
                               "torch.distributed ProcessGroup, got str 'all'"),
])
def test_find_batch_size_names_the_argument_it_refuses_before_recording(kwargs, said):
    x, y = xy()
    with pytest.raises(ValueError) as e:
        memfit.find_batch_size(ForwardRaises(), x, y, loss_fn=nn.CrossEntropyLoss(),
                               optimizer="sgd", budget="1MiB", **kwargs)
    assert one_line(e) == said


def test_an_optimizer_class_is_told_to_be_made():
    m = small()
    x, y = xy()
    with pytest.raises(ValueError) as e:  # was: "... or None, got type"
        memfit.profile(m, x, y, loss_fn=nn.CrossEntropyLoss(), optimizer=torch.optim.AdamW)
    assert one_line(e) == ("[profile] optimizer is the class AdamW, not an optimizer: make one "
                           "over the model's parameters, torch.optim.AdamW(model.parameters())")


def test_a_budget_below_the_model_is_said_under_the_users_call():
    m = small()
    x, y = xy()
    with pytest.raises(memfit.DoesNotFit) as e:  # was tagged [fit_batch], the core's name
        memfit.find_batch_size(m, x, y, loss_fn=nn.CrossEntropyLoss(), optimizer="adam",
                               budget=1024)
    assert one_line(e).startswith("[find_batch_size] budget 1.00 KiB is below what the model "
                                  "needs before any sample: "), str(e.value)


@pytest.mark.parametrize("call,said", [
    (lambda: memfit.LengthBatchSampler([3, 0, 5], lambda n: 4),
     "[LengthBatchSampler] the length of sample 1 must be an int >= 1, got int 0"),
    (lambda: memfit.LengthBatchSampler("35", lambda n: 4),
     "[LengthBatchSampler] lengths must be each sample's length, a list of ints, got str '35'"),
    # Was read letter by letter: "each of lengths must be an int >= 1, got str '1'".
    (lambda: memfit.find_batch_size(small(), *xy(), loss_fn=nn.CrossEntropyLoss(),
                                    budget="1MiB", seq_dim=1, lengths="16"),
     "[find_batch_size] lengths must be a list of ints, got str '16'"),
], ids=["zero", "sampler-str", "fit-str"])
def test_lengths_name_the_sample_or_the_argument(call, said):
    with pytest.raises(ValueError) as e:
        call()
    assert one_line(e) == said
