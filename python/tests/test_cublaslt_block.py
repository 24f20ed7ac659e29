"""cuBLASLt's workspace on a card, a 1 MiB block of the small pool taken at
the forward's first Linear and never freed (Note [cuBLASLt's block in the
replay], allocator_model.cpp): memfit counts it once in the allocated bytes
and replays it, so the step's small blocks fill the rest of its 2 MiB
segment as they do on the card. The H200 gpt step is then predicted to the
byte, allocated and reserved."""

import json
import os

import memfit
from memfit import _memfit

HERE = os.path.dirname(os.path.abspath(__file__))
GPT = os.path.join(HERE, "..", "..", "tests", "data", "snapshots", "h200", "gpt_adam.pickle")
MiB = 1 << 20


def test_the_default_workspace_is_65_mib_allocated_and_66_mib_reserved():
    workspace = _memfit.DEFAULT_CUDA_WORKSPACE
    assert workspace == 66 * MiB
    assert _memfit.cuda_workspace_allocated(workspace) == 65 * MiB
    assert _memfit.cuda_workspace_held(workspace) == 64 * MiB
    assert _memfit.CUBLASLT_WORKSPACE == MiB
    # Under cuBLASLt's segment the workspace is held aside whole.
    assert _memfit.cuda_workspace_allocated(MiB) == _memfit.cuda_workspace_held(MiB) == MiB


def test_the_h200_gpt_step_is_predicted_to_the_byte():
    with open(GPT[: -len(".pickle")] + ".json") as f:
        p = json.load(f)["predict"]
    report, timeline = _memfit.profile_builtin(
        p["model"], p["batch"], p["optimizer"], p["iterations"], _memfit.DEFAULT_CUDA_WORKSPACE)
    c = memfit.load_snapshot(GPT).compare(report, timeline)
    assert c.workspace_bytes == 65 * MiB
    assert c.predicted_peak_allocated == report.peak_bytes + 65 * MiB
    assert c.predicted_peak_allocated == c.measured_peak_allocated == 157957128, c.table()
    assert c.predicted_peak_reserved == c.measured_peak_reserved == 182452224, c.table()
    assert report.cuda.peak_reserved == 182452224
    # The second iteration's reserved bytes, phase by phase, are the card's.
    second = [r for r in c.phases if r.iteration == 2]
    assert len(second) == 6
    assert all(r.predicted_reserved == r.measured_reserved for r in second), c.table()
    for r in second:
        if r.phase in ("forward", "loss", "backward", "zero_grad"):
            assert r.predicted_allocated == r.measured_allocated, c.table()
