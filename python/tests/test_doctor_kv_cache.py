"""kv_cache claims what turning the cache off takes off the steps' peak, as
plain steps on the simulated device measure it: in the usual loop the
output, cache and all, is replaced as the next forward returns, before
backward holds the peak, so use_cache=True costs nothing there and is no
finding (it said 64 KiB per step)."""

import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes
from memfit.testing.models import tiny_llama
from memfit.testing.truth import smallest_budget

STEPS = 3


def setup(use_cache):
    model = tiny_llama().train()
    model.config.use_cache = use_cache
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    return model, opt, [torch.randint(0, 64, (4, 64), generator=g) for _ in range(STEPS)]


def body(model, opt, data):
    for ids in data:
        outputs = model(input_ids=ids, labels=ids)
        loss = outputs.loss
        loss.backward()
        opt.step()
        opt.zero_grad()


def _runs(budget, use_cache):
    gc.collect()
    left = tracked_live_bytes("cpu")
    try:
        with memfit.simulated_device(budget + left):
            body(*setup(use_cache))
        return True
    except torch.cuda.OutOfMemoryError:
        return False


def true_peak(use_cache):
    return smallest_budget(lambda budget: _runs(budget, use_cache), 1 << 20, 4 << 20, 1024)


def test_a_kv_cache_replaced_before_backward_is_no_finding():
    pytest.importorskip("transformers")
    assert _runs(true_peak(False), True)  # the cache needs no byte more
    for use_cache in (True, False):
        model, opt, data = setup(use_cache)
        with memfit.doctor(model, opt, trials=False) as d:
            body(model, opt, data)
        assert [f for f in d.findings if f.kind == "kv_cache"] == [], d.report()
