"""Every CUDA memory snapshot under tests/data/snapshots/ (recorded on a GPU
by `scripts/gpu_check.sh --snapshots`; synthetic ones under synthetic/, named
so): memfit's allocator replay must reproduce the card's reserved bytes
(within 1% at every event, the peak exact) and, where the fixture's metadata
names the step, memfit's prediction recorded on the CPU must come within 2%
of the card's peak allocated bytes and 0% to +3% of its peak reserved bytes;
where the step has convolutions, the card must lie between the point and the
point plus cuDNN's workspaces (test_cudnn_range.py). A fixture whose replay is
known to differ says where in "replay_known_off", and its test is a strict
xfail. New fixtures are picked up as they are dropped in."""

import glob
import json
import os

import pytest

import memfit

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "tests", "data", "snapshots")
FIXTURES = sorted(glob.glob(os.path.join(DATA, "**", "*.pickle"), recursive=True))


def metadata(path):
    meta = os.path.splitext(path)[0] + ".json"
    if not os.path.exists(meta):
        return {}
    with open(meta) as f:
        return json.load(f)


def test_there_is_a_fixture():
    assert FIXTURES, f"no snapshots under {DATA}"


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: os.path.relpath(p, DATA))
def test_the_replay_reproduces_the_card(path, request):
    meta = metadata(path)
    if meta.get("replay_known_off"):  # strict: says so when the replay is fixed
        request.applymarker(pytest.mark.xfail(reason=meta["replay_known_off"], strict=True))
    s = memfit.load_snapshot(path)
    r = s.replay()
    if r.status == "not replayed":
        assert meta.get("expandable_segments"), r.reason
        return
    assert r.status == "checked", r.reason
    assert r.max_rel_error <= 0.01, r.summary()
    assert r.peak_reserved_replayed == r.peak_reserved_measured, r.summary()
    assert r.segments_replayed == r.segments_measured, r.summary()


@pytest.mark.parametrize("path", [p for p in FIXTURES if metadata(p).get("predict")],
                         ids=lambda p: os.path.relpath(p, DATA))
@pytest.mark.slow
def test_the_prediction_comes_within_the_fixtures_tolerance(path):
    meta = metadata(path)
    p = meta["predict"]
    import memfit._memfit as native

    report, timeline = native.profile_builtin(p["model"], p["batch"], p.get("optimizer", "adam"),
                                              p.get("iterations", 2),
                                              p.get("cuda_workspace",
                                                    native.DEFAULT_CUDA_WORKSPACE))
    c = memfit.load_snapshot(path).compare(report, timeline)
    if c.cudnn_workspace_bytes is None:  # no convolution: the point is the prediction
        assert abs(c.allocated_error) <= 0.02, c.table()
        assert 0 <= c.reserved_error <= 0.03, c.table()
    else:  # the workspaces cuDNN picks are a range: See Note [cuDNN's workspace at the step's peak]
        assert c.allocated_in_range and c.reserved_in_range, c.table()


CARD_FIXTURES = [p for p in FIXTURES
                 if not metadata(p).get("synthetic", True) and not metadata(p).get("oom")]


@pytest.mark.parametrize("path", CARD_FIXTURES, ids=lambda p: os.path.relpath(p, DATA))
def test_cublas_workspaces_on_a_card_are_workspaces_not_gradients(path):
    # Each fixture's step multiplies in its forward and its backward: two
    # cuBLAS workspaces of Hopper's 32 MiB (See Note [Workspaces in a
    # snapshot]); its gradients are the trainable parameters' bytes, and the
    # loop frees them (set_to_none) before the next forward.
    s = memfit.load_snapshot(path)
    workspace = s.categories_at_peak["workspace"]
    assert 64 << 20 <= workspace <= 66 << 20, s.categories_at_peak
    assert s.categories_at_peak["gradient"] <= s.categories_at_peak["parameter"], \
        s.categories_at_peak
    assert "grads_kept" not in [f.kind for f in s.findings()]


@pytest.mark.parametrize("path", CARD_FIXTURES, ids=lambda p: os.path.relpath(p, DATA))
def test_a_trace_whose_ring_buffer_dropped_its_start_still_names_the_workspaces(path, tmp_path):
    # _record_memory_history(max_entries=N) keeps the last N entries: cut
    # each card's trace to its last 60%. Its workspaces were made before
    # what is left (See Note [What was live before the trace]); they were
    # "other" and the phase table said "+65 MiB: activations saved for
    # backward" of a made-up first iteration.
    import pickle

    with open(path, "rb") as f:
        raw = pickle.load(f)
    trace = raw["device_traces"][0]
    raw["device_traces"][0] = trace[len(trace) * 2 // 5:]
    cut = tmp_path / "cut.pickle"
    with open(cut, "wb") as f:
        pickle.dump(raw, f)
    s = memfit.load_snapshot(str(cut))
    assert s.events.pre_existing > 0, "the cut kept the whole trace"
    assert 64 << 20 <= s.categories_at_peak["workspace"] <= 66 << 20, s.categories_at_peak
    assert "grads_kept" not in [f.kind for f in s.findings()]
    assert s.report().phases[0].name == "other"  # one span for what was live before
