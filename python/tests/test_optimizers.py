"""The built-in optimizers are the core's list: Python builds each one the
core names, and reads a torch optimizer back to its built-in name."""

import torch

from memfit._native import native
from memfit._step.offload import OffloadedOptimizer
from memfit._step.training_step import OPTIMIZERS
from memfit.plan.strategies.optimizer import kind_of


def params():
    return list(torch.nn.Linear(4, 2).parameters())


def test_python_builds_every_builtin_the_core_names_and_only_those():
    specs = native.builtin_optimizers()
    assert [s.name for s in specs] == native.optimizer_names()
    assert sorted(OPTIMIZERS) == sorted(s.name for s in specs if s.torch_class)
    assert "none" in native.optimizer_names() and "none" not in OPTIMIZERS  # Python says None


def test_each_builtin_is_built_as_its_spec_says():
    for s in native.builtin_optimizers():
        if not s.torch_class:
            continue
        opt = OPTIMIZERS[s.name](params())
        inner = opt.inner if s.on_host else opt
        assert isinstance(opt, OffloadedOptimizer) == s.on_host, s.name
        assert type(inner) is getattr(torch.optim, s.torch_class), s.name
        assert inner.defaults["lr"] == s.lr
        assert inner.defaults.get("momentum", 0) == s.momentum, s.name


def test_a_torch_optimizer_reads_back_as_its_builtin_name():
    for name, build in OPTIMIZERS.items():
        assert kind_of(build(params())) == name
    assert kind_of(torch.optim.SGD(params(), lr=0.1, momentum=0.5)) == "momentum"
    assert kind_of(torch.optim.AdamW(params())) == "AdamW"
    assert kind_of(None) == "none"


def test_advise_choices_are_the_cores_for_a_python_kind():
    choices = native.optimizer_choices(kind_of(torch.optim.SGD(params(), lr=0.1, momentum=0.9)))
    assert choices.others == ["adam", "sgd"]
    assert choices.lighter == ["sgd"]
