"""cuDNN's convolution workspaces, left out of a CUDA target's point
prediction and said as a range (Note [cuDNN's workspace at the step's peak],
card_kernels.cpp): the report's note gives the bytes they can add at the
peak, and a comparison with a card's snapshot shows the point up to the
point plus them. The H200 fixtures' card peaks lie inside that range."""

import glob
import json
import os

import pytest

import memfit
from memfit import _memfit

HERE = os.path.dirname(os.path.abspath(__file__))
H200 = os.path.join(HERE, "..", "..", "tests", "data", "snapshots", "h200")
MARK = "cuDNN convolution's workspace (not counted)"


def predicted(path):
    with open(path[: -len(".pickle")] + ".json") as f:
        return json.load(f).get("predict")


PREDICTED = [p for p in sorted(glob.glob(os.path.join(H200, "*.pickle"))) if predicted(p)]


def cudnn_notes(report):
    return [n for n in report.notes if n.startswith("cuDNN")]


def live_at_marks(timeline):
    """The bytes live at each cuDNN workspace mark, in order, and the
    timeline's peak, by walking its events."""
    live = peak = 0
    at_marks = []
    for e in timeline.events():
        live += e[1] if e[0] == "alloc" else -e[1]
        peak = max(peak, live)
        if e[0] == "alloc" and e[-1] == MARK:
            at_marks.append(live)
    return at_marks, peak


def test_a_cnn_for_a_card_says_what_cudnn_can_add_at_its_peak():
    report, timeline = _memfit.profile_builtin("cnn", 2, "sgd", 2, 0)
    [note] = cudnn_notes(report)
    said = _memfit.cudnn_workspace_in_notes(report.notes)
    assert f"up to {_memfit.format_bytes(said)} ({said} B)" in note, note
    assert "capped, cuDNN falls back to engines that need less" in note
    # A mark per convolution forward and per backward, empty: the point is
    # not moved. 9 convolutions (the stem, 2 per block, 2 shortcuts), each
    # run forward and backward, in 2 iterations.
    marks = [e for e in timeline.events() if e[0] == "alloc" and e[-1] == MARK]
    assert len(marks) == 2 * 2 * 9
    assert all(e[1] == 0 for e in marks)
    assert "over the 36 convolution forwards and backwards" in note


def test_a_model_without_convolutions_says_nothing_of_cudnn():
    report, _ = _memfit.profile_builtin("mlp", 8, "adam", 2, 0)
    assert cudnn_notes(report) == []
    assert _memfit.cudnn_workspace_in_notes(report.notes) == -1


def test_a_host_target_says_nothing_of_cudnn():
    import torch

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten())
    x, y = torch.randn(2, 3, 8, 8), torch.zeros(2, 8 * 6 * 6)
    report = memfit.profile(model, x, y, loss_fn=torch.nn.functional.mse_loss,
                            optimizer="sgd", iterations=1, target_device="cpu")
    assert cudnn_notes(report) == []
    assert not any(e[-1] == MARK for e in report.timeline.events())


# The point is recorded on this CPU, without the host's convolution
# temporaries (Note [A card's rehearsal drops the host's convolution
# temporaries], op_frames.h): the same under oneDNN's AVX2 kernels as under
# its AVX-512 ones, so this holds on either.
@pytest.mark.parametrize("path", PREDICTED, ids=os.path.basename)
@pytest.mark.slow
@pytest.mark.numerics
def test_the_card_lies_in_the_predicted_range(path):
    p = predicted(path)
    report, timeline = _memfit.profile_builtin(
        p["model"], p["batch"], p.get("optimizer", "adam"), p.get("iterations", 2),
        p.get("cuda_workspace", _memfit.DEFAULT_CUDA_WORKSPACE))
    c = memfit.load_snapshot(path).compare(report, timeline)
    if not cudnn_notes(report):  # no convolution: the point alone
        assert c.cudnn_workspace_bytes is None
        assert c.predicted_peak_allocated_upper == c.predicted_peak_allocated
        assert c.allocated_upper_error == c.allocated_error
        return
    # The point stays the point: below the card (the workspace it leaves
    # out), and the card within the bound above it.
    assert c.cudnn_workspace_bytes > 0
    assert c.predicted_peak_allocated == report.peak_bytes + c.workspace_bytes
    assert c.predicted_peak_allocated < c.measured_peak_allocated, c.table()
    assert c.measured_peak_allocated <= c.predicted_peak_allocated_upper, c.table()
    assert c.allocated_in_range
    assert "is inside it" in c.table()
    d = c.as_dict()
    assert d["allocated_error"] == c.allocated_error < 0 < d["allocated_upper_error"]


def test_a_profiled_convolution_for_a_card_is_marked_and_its_note_has_the_exact_bytes():
    # memfit.profile records the marks as the built-in profile does; the note
    # is made from them and each mark's bound. One 3x3 convolution, 8
    # channels, on [4, 8, 16, 16]: x 8192, y and dy 6272, w 576 elements.
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, bias=False), torch.nn.Flatten())
    x, y = torch.randn(4, 8, 16, 16), torch.zeros(4, 8 * 14 * 14)
    report = memfit.profile(model, x, y, loss_fn=torch.nn.functional.mse_loss,
                            optimizer="sgd", iterations=2, target_device="cuda", mode="cpu")
    bound = 4 * (9 * (8192 + 6272) // 4 + 4 * 576)
    assert bound == _memfit.cudnn_conv_backward_workspace(8192, 6272, 576) == 139392
    at_marks, peak = live_at_marks(report.timeline)
    # Each iteration's forward and backward, the forward's bound the same:
    # x 8192 and y 6272 elements, as dy.
    assert len(at_marks) == 4 and peak == report.peak_bytes
    want = max(at_marks) + bound - peak
    assert want > 0  # the bound passes this step's peak
    note = _memfit.cudnn_workspace_note(report.timeline, [bound] * 4, 4)
    assert "at batch 4, on a free card" in note
    assert _memfit.cudnn_workspace_in_notes([note]) == want
    assert _memfit.cudnn_workspace_note(report.timeline, [], 4) == ""
    # The profile's own report carries that note, and a comparison reads it.
    assert cudnn_notes(report) == [note]
    assert _memfit.cudnn_workspace_in_notes(report.notes) == want


def test_a_frozen_convolutions_forward_workspace_is_in_the_range():
    # A frozen stem (no backward: its weight and input need no gradient)
    # and a trained head. cuDNN takes a workspace in every forward, so the
    # stem's forward is marked with its bound, 4 B x (9/4 (x + y) + 4 w)
    # (Note [cuDNN's convolution workspace]), and that is where the range's
    # top is reached: the head's backward alone says less.
    import torch

    torch.manual_seed(0)
    stem = torch.nn.Conv2d(8, 32, 3, bias=False).requires_grad_(False)
    head = torch.nn.Conv2d(32, 1, 3, bias=False)
    model = torch.nn.Sequential(stem, head, torch.nn.Flatten())
    x, y = torch.randn(4, 8, 16, 16), torch.zeros(4, 12 * 12)
    report = memfit.profile(model, x, y, loss_fn=torch.nn.functional.mse_loss,
                            optimizer="sgd", iterations=2, target_device="cuda", mode="cpu")
    # stem: x 4 x 8 x 16 x 16, y 4 x 32 x 14 x 14, w 32 x 8 x 9; head: x the
    # stem's y, y 4 x 1 x 12 x 12, w 32 x 9, in its forward and its backward.
    stem_bound = 4 * (9 * (8192 + 25088) // 4 + 4 * 2304)
    head_bound = 4 * (9 * (25088 + 576) // 4 + 4 * 288)
    assert (stem_bound, head_bound) == (336384, 235584)
    assert head_bound == _memfit.cudnn_conv_backward_workspace(25088, 576, 288)
    bounds = [stem_bound, head_bound, head_bound] * 2  # the marks' order, 2 iterations
    at_marks, peak = live_at_marks(report.timeline)
    assert len(at_marks) == len(bounds) and peak == report.peak_bytes
    with_bounds = [m + b for m, b in zip(at_marks, bounds)]
    want = max(with_bounds) - peak
    assert with_bounds.index(max(with_bounds)) % 3 == 0  # at the stem's forward
    backwards_alone = max(with_bounds[2::3]) - peak
    assert want > max(backwards_alone, 0)
    said = _memfit.cudnn_workspace_in_notes(report.notes)
    assert said == want
    [note] = cudnn_notes(report)
    assert f"({want} B), in forward" in note
    assert "over the 6 convolution forwards and backwards" in note
