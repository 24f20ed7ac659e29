// Reading a CUDA memory snapshot, the pickle torch.cuda.memory._dump_snapshot
// writes, in bounded memory and without unpickling it.
// See Note [Reading a snapshot in bounded memory] in snapshot_reader.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace memfit {

// The file is not a torch memory snapshot; what() is one line naming why.
class SnapshotFormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The actions of torch's TraceEntry, in the words of its snapshot.
enum class TraceAction : uint8_t {
  kAlloc,          // a block handed out: addr, size = the bytes asked for
  kFreeRequested,  // the block's owner let go of it (allocated bytes drop)
  kFreeCompleted,  // the block is back in the cache (after other streams)
  kSegmentAlloc,   // cudaMalloc of a segment: addr, size
  kSegmentFree,    // cudaFree of a segment (empty_cache, or before an OOM)
  kSegmentMap,     // expandable segments: pages mapped into a segment
  kSegmentUnmap,   // expandable segments: pages unmapped
  kOom,            // an allocation failed: size = rounded request
  kSnapshot,       // a snapshot was taken here
};
inline constexpr int kNumTraceActions = 9;
const char* to_string(TraceAction a);

struct SnapshotFrame {
  std::string filename;
  int64_t line = 0;
  std::string name;
};

struct SnapshotBlock {
  uint64_t address = 0;
  int64_t size = 0;
  int64_t requested_size = 0;
  std::string state;  // active_allocated | active_pending_free | inactive
  uint32_t stack = 0;  // index into Snapshot::stacks
};

struct SnapshotSegment {
  int64_t device = 0;
  uint64_t address = 0;
  int64_t total_size = 0;
  int64_t stream = 0;
  std::string segment_type;  // small | large
  int64_t allocated_size = 0;
  int64_t active_size = 0;
  bool is_expandable = false;
  std::vector<SnapshotBlock> blocks;
};

// One device's trace as columns, in order. For kOom, addr holds the entry's
// device_free (what CUDA said was free).
struct SnapshotTrace {
  std::vector<uint8_t> action;  // TraceAction
  std::vector<uint64_t> addr;
  std::vector<int64_t> size;
  std::vector<int64_t> stream;
  std::vector<int64_t> time_us;
  std::vector<uint32_t> stack;
  size_t size_of() const { return action.size(); }
};

struct Snapshot {
  std::vector<SnapshotSegment> segments;
  std::vector<SnapshotTrace> traces;  // one per device, as device_traces
  bool has_traces = false;            // the file had device_traces at all
  std::vector<SnapshotFrame> frames;  // each distinct frame once
  // Each distinct stack once, innermost call first (torch's order), as
  // indices into frames; stacks[0] is the empty stack.
  std::vector<std::vector<uint32_t>> stacks;
  // allocator_settings, each value as Python would print it.
  std::map<std::string, std::string> allocator_settings;
  // Actions this reader does not know, with their counts (skipped).
  std::map<std::string, int64_t> unknown_actions;
};

// Throws SnapshotFormatError for a file that is not a snapshot (one line
// naming `path` and why) and std::runtime_error for one that cannot be read.
Snapshot read_snapshot(const std::string& path);

}  // namespace memfit
