"""The core walks a snapshot's trace once: a free of a block the trace never
allocated was live from its start, a block freed inside its phase is a
temporary, and the reserved bytes run from the dump's segments back."""

import array

from memfit._native import native

ALLOC, FREE_REQUESTED, SEGMENT_ALLOC = 0, 1, 3


def test_one_walk_finds_what_was_live_before_the_trace_and_the_reserved_peak():
    # (action, addr, size, stack); stack 1 says forward, 2 says nothing.
    entries = [(SEGMENT_ALLOC, 0x1000, 4096, 0), (ALLOC, 0x1000, 512, 1),
               (FREE_REQUESTED, 0x9000, 256, 2), (FREE_REQUESTED, 0x1000, 512, 1)]
    cols = [array.array(c, [e[k] for e in entries]) for k, c in ((0, "B"), (1, "Q"), (2, "q"))]
    n = len(entries)
    e = native.snapshot_events(
        cols[0], cols[1], cols[2], array.array("q", [0] * n), array.array("q", range(n)),
        array.array("I", [x[3] for x in entries]), reserved_at_dump=4096 + 2048,
        live_at_dump=[], stack_phase=["", "forward", ""], stack_place=["", "net.py:3 forward", ""])
    assert e["pre_existing"] == 1 and e["allocated_at_start"] == 256
    assert e["reserved_at_start"] == 2048 and e["peak_reserved_bytes"] == 2048 + 4096
    assert e["peak_reserved_trace_index"] == 0
    assert array.array("q", e["trace_index"]).tolist() == [-1, 1, 2, 3]
    assert e["spans"] == [(0, "other", 1), (1, "forward", 1)]
    assert e["phase_of_alloc"] == ["other", "forward"]
    tl = e["timeline"]
    assert len(tl) == 4
    assert tl.breakdown_at_peak()["categories"]["temporary"] == 512  # freed inside forward
    assert any("the trace starts after 1 allocations" in note for note in e["notes"])
