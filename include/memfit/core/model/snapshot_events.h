// A CUDA memory snapshot's trace as memfit events: allocations and frees
// become a Timeline (so the reports of a recorded step follow), with phases,
// places and categories, and the reserved bytes beside it. One walk over the
// trace, in the core; what a stack's frames say (its phase, its place in the
// code) is the front's to read (python/memfit/explain/frames.py) and comes
// in per stack. See Note [Allocated and reserved bytes from a trace] and
// Note [Workspaces in a snapshot] in snapshot_events.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "memfit/core/model/snapshot_reader.h"
#include "memfit/core/model/timeline.h"

namespace memfit {

// Events as columns, one row each, as a front that built them holds them.
struct EventColumns {
  std::vector<uint8_t> kinds;        // 0 alloc, 1 free
  std::vector<int64_t> bytes;
  std::vector<uint64_t> ids;
  std::vector<int64_t> times_ns;
  std::vector<uint8_t> categories;   // Category
  std::vector<uint32_t> modules;     // into module_names
};

// Where a phase span starts: its first event, its name, its iteration.
using SpanStart = std::tuple<size_t, std::string, int>;

// A CUDA Timeline of `events` with phase spans. Throws std::invalid_argument
// for columns of different lengths, a category or module out of range.
Timeline timeline_from_events(const EventColumns& events,
                              const std::vector<std::string>& module_names,
                              const std::vector<SpanStart>& spans);

// A block live at the dump (active_allocated or active_pending_free).
struct LiveBlock {
  uint64_t address = 0;
  int64_t bytes = 0;  // requested size, else its size
  uint32_t stack = 0;
};

// What the walk needs beside the trace. Per stack id (Snapshot::stacks):
// the phase its frames say ("" when they do not; "user": only the user's
// own code, a tensor made by hand) and its place in the code ("": none).
struct SnapshotEventsInput {
  int64_t reserved_at_dump = 0;      // the device's segments' total size
  std::vector<LiveBlock> live_at_dump;  // in the dump's order
  std::vector<std::string> stack_phase;
  std::vector<std::string> stack_place;
};

// An "oom" entry: the request that failed, and what was live then.
struct SnapshotOom {
  int64_t trace_index = 0;
  int64_t size = 0;         // the rounded request that failed
  uint64_t device_free = 0;  // what CUDA said was free
  int64_t stream = 0;
  uint32_t stack = 0;
  int64_t events_before = 0;  // timeline events before it
  int64_t reserved = 0;       // reserved bytes at it
};

struct SnapshotEvents {
  Timeline timeline;
  std::vector<int64_t> trace_index;     // per event: its entry (-1: live before the trace)
  std::vector<int64_t> reserved_after;  // per event: reserved bytes right after it
  std::vector<uint32_t> stacks;         // per allocation event: its stack
  int64_t peak_reserved_bytes = 0;
  int64_t peak_reserved_trace_index = -1;  // -1: never above its start
  int64_t reserved_at_start = 0;
  int64_t allocated_at_start = 0;  // live bytes counted from before the trace
  int64_t pre_existing = 0;        // allocations counted from before the trace
  std::vector<SnapshotOom> ooms;
  std::vector<SpanStart> spans;
  std::vector<std::string> phase_of_alloc;  // per allocation event
  std::vector<std::string> notes;
  bool expandable = false;  // segment_map/unmap seen
};

// Bytes of the library workspaces a trace holds (Note [Workspaces in a
// snapshot]): cuBLAS's on Hopper, on older cards, cuBLASLt's.
const std::vector<int64_t>& snapshot_workspace_sizes();

// Throws std::invalid_argument for per-stack lists shorter than a stack id
// the trace or the live blocks name.
SnapshotEvents snapshot_events(const SnapshotTrace& trace, const SnapshotEventsInput& input);

}  // namespace memfit
