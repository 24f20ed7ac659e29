"""`memfit advise` (C++, on the built-in gpt) and memfit.advise (Python, on
its twin in memfit.testing.models) run one planner (core/advise_plan.h): on the
same model and budget they give the same plan."""

import json
import pathlib

import pytest
import torch

import memfit
from memfit import _memfit
from memfit.testing import models

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAYERS, WIDTH, HEADS, CONTEXT, VOCAB, BATCH = 4, 32, 2, 64, 1024, 4


def twins():
    return models


def cli_advice(capfd, budget, *more):
    capfd.readouterr()
    status = _memfit.run_cli(["advise", "--model", "gpt", "--layers", str(LAYERS), "--width",
                              str(WIDTH), "--heads", str(HEADS), "--context", str(CONTEXT),
                              "--batch", str(BATCH), "--budget", str(budget), "--repeats", "0",
                              "--json", "--quiet", *more])
    out = capfd.readouterr().out
    return status, json.loads(out[out.index("{"):])


@pytest.fixture(scope="module")
def gpt_twin():
    m = twins()
    torch.manual_seed(0)
    model = m.Gpt(LAYERS, WIDTH, HEADS, CONTEXT, VOCAB)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, CONTEXT), generator=g)
    target = torch.randint(0, VOCAB, (BATCH, CONTEXT), generator=g)
    return model, ids, target, m.gpt_loss


def test_cli_and_python_plan_the_same_on_the_same_model(capfd, gpt_twin):
    model, ids, target, loss_fn = gpt_twin
    # Both keep the batch's ids and targets out of the budget (the Trainer's
    # whole batch stays on the device): each plans for the same limit.
    reserve = ids.nbytes + target.nbytes
    # The CLI's step drops the logits once the loss exists: keep_output=False.
    free = memfit.advise(model, ids, target, loss_fn=loss_fn, repeats=0, keep_output=False)
    plain = free.plain_peak_bytes
    every = next(r for r in free.rows if r.name.startswith("checkpoint every")).peak_bytes
    assert every < plain
    # A budget checkpointing meets at the whole batch; one only micro-batches
    # of checkpointed steps meet.
    for limit in ((plain + every) // 2, every * 9 // 10):
        status, cli = cli_advice(capfd, limit + reserve)
        py = memfit.advise(model, ids, target, loss_fn=loss_fn, budget=limit + reserve,
                           repeats=0, keep_output=False)
        assert status == (0 if py.plan.found else 2)
        assert cli["plan"]["found"] == py.plan.found
        # The same plan: as many blocks checkpointed, the same micro-batch,
        # the same peak. Which of equal-memory blocks it picks follows their
        # recorded forward times (the least recompute), one noisy sample of
        # a clock in each process, so the block indices may differ.
        c, p = cli["plan"]["strategy"], py.plan.strategy
        assert len(c["checkpoint"]) == len(p.checkpoint), (cli["plan"], py.table())
        assert (c["host_state"], c["autocast_bf16"]) == (p.host_state, p.autocast_bf16)
        assert cli["plan"]["micro_batch"] == py.plan.micro_batch
        assert abs(cli["plan"]["peak_bytes"] - py.plan.peak_bytes) <= 0.01 * py.plan.peak_bytes
        # The same rows, in the same order, within 1% of each other (the
        # planned row's blocks as the plan's, above).
        def kind(name):
            name = name.replace("adam-offload", "memfit.offload")
            return name.split(": blocks")[0] if name.startswith("checkpoint planned") else name

        assert [kind(r["name"]) for r in cli["strategies"]] == [kind(r.name) for r in py.rows]
        for c, p in zip(cli["strategies"], py.rows):
            assert abs(c["peak_bytes"] - p.peak_bytes) <= 0.01 * p.peak_bytes, p.name
