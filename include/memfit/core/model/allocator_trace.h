// memfit's caching-allocator replay run on a real allocator's own trace (a
// CUDA memory snapshot's alloc / free / cache-release steps, in order), so
// that its reserved bytes can be held against the card's at every step.
// See Note [Replaying a snapshot's trace] in allocator_trace.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace memfit {

struct AllocatorOp {
  enum Kind : uint8_t {
    kMalloc,        // `bytes` asked for under `id` on `stream`
    kFree,          // `id`'s block back in the cache
    kReleaseCache,  // every wholly free cached segment released
  };
  Kind kind = kMalloc;
  uint64_t id = 0;
  int64_t bytes = 0;
  int64_t stream = 0;
};

// The op of kind `kind` (AllocatorOp::Kind's value, as a front's column
// holds it). Throws std::invalid_argument for a kind past kReleaseCache.
AllocatorOp allocator_op(uint8_t kind, uint64_t id, int64_t bytes, int64_t stream);

struct AllocatorReplay {
  std::vector<int64_t> reserved;   // after each op
  std::vector<int64_t> allocated;  // block bytes after each op
  std::vector<int64_t> segments;   // segment sizes at the end, ascending
  int num_ooms = 0;                // mallocs that did not fit `capacity`
};

// Replays `ops` through a CudaAllocatorModel (default
// PYTORCH_CUDA_ALLOC_CONF). Frees of unknown ids are ignored; a malloc of an
// id still allocated frees it first (a trace whose free was not recorded).
AllocatorReplay replay_allocator_ops(const std::vector<AllocatorOp>& ops,
                                     std::optional<int64_t> capacity = {});

}  // namespace memfit
