"""memfit's caching-allocator replay held against a trace whose segments
were built by hand from the allocator's documented rules (not by the
replay): reserved bytes at every event, the peak, the segments at the end."""

import pytest

import memfit
from snapshot_fixtures import MiB, SnapshotBuilder, allocator_rules_trace, stack


def test_the_replay_reproduces_a_hand_built_trace(tmp_path):
    s = memfit.load_snapshot(allocator_rules_trace().write(tmp_path / "rules.pickle"))
    r = s.replay()
    assert r.status == "checked"
    assert r.events_compared == 10  # 8 allocations, 2 frees
    assert (r.events_off, r.max_rel_error, r.first_off) == (0, 0.0, None)
    assert r.peak_reserved_measured == r.peak_reserved_replayed == 44 * MiB
    assert r.segments_measured == r.segments_replayed == [2 * MiB, 2 * MiB, 20 * MiB, 20 * MiB]
    assert r.matches
    assert "replay_differs" not in {f.kind for f in s.findings()}
    # The card's reserved bytes after each allocation and free, the replay
    # held to them (See allocator_rules_trace; 24 MiB lasts from the release
    # to the next cudaMalloc only).
    seen = sorted(set(s.events.reserved_after))
    assert seen == [2 * MiB, 22 * MiB, 34 * MiB, 36 * MiB, 44 * MiB]


def test_a_trace_the_rules_do_not_explain_is_a_finding(tmp_path):
    b = SnapshotBuilder()
    A, A2 = 0x10000000, 0x20000000
    b.segment_alloc(A, 2 * MiB)
    b.alloc(A, 1000, stack("forward_fc1"))
    b.segment_alloc(A2, 2 * MiB)  # A had room: the caching allocator would not
    b.alloc(A2, 1000, stack("forward_fc2"))
    s = memfit.load_snapshot(b.write(tmp_path / "odd.pickle"))
    r = s.replay()
    assert (r.status, r.events_compared, r.events_off) == ("checked", 2, 1)
    assert r.first_off == (3, 4 * MiB, 2 * MiB)
    assert r.max_rel_error == pytest.approx(0.5)
    assert not r.matches
    (f,) = [f for f in s.findings() if f.kind == "replay_differs"]
    assert f.where == "model.py:43 forward"
    assert f.bytes == 2 * MiB
    assert "first off at trace entry 3: 2.00 MiB replayed, 4.00 MiB on the card" in f.seen


def test_expandable_segments_are_not_replayed(tmp_path):
    b = SnapshotBuilder()
    b.segment_alloc(0x10000000, 20 * MiB, record=False)
    b.live_segments[0x10000000]["expandable"] = True
    b._entry("segment_map", 0x10000000, 20 * MiB)
    b.alloc(0x10000000, 5 * MiB, stack("forward_fc1"))
    s = memfit.load_snapshot(b.write(tmp_path / "exp.pickle"))
    assert s.replay().status == "not replayed"
    assert "expandable_segments" in s.replay().reason
    assert s.peak_reserved_bytes == 20 * MiB
