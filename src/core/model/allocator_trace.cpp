#include "memfit/core/model/allocator_trace.h"

#include <stdexcept>
#include <string>

#include "memfit/core/model/allocator_model.h"

namespace memfit {

// Note [Replaying a snapshot's trace]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A snapshot's trace is what the real allocator did: "alloc" (the bytes
// asked for, on a stream), "free_completed" (the block back in its pool),
// "segment_alloc" / "segment_free" (cudaMalloc / cudaFree). The replay is
// given only the first two, in order, and decides the segments itself; its
// reserved bytes are then held against the trace's own (the running sum of
// segment_alloc - segment_free) at every step.
// One thing the replay cannot decide: when the allocator gave segments back.
// The real one does so when cudaMalloc fails (the card is full, or
// set_per_process_memory_fraction's cap) and on torch.cuda.empty_cache(),
// and both release every wholly free cached segment (release_cached_blocks);
// the card's free memory is not in the trace. So each run of segment_free
// in the trace becomes a kReleaseCache step at the same place: the replay
// releases what *it* holds free there, and any difference still shows.

AllocatorOp allocator_op(uint8_t kind, uint64_t id, int64_t bytes, int64_t stream) {
  if (kind > AllocatorOp::kReleaseCache) {
    throw std::invalid_argument("[explain] bad op kind " + std::to_string(kind));
  }
  return AllocatorOp{static_cast<AllocatorOp::Kind>(kind), id, bytes, stream};
}

AllocatorReplay replay_allocator_ops(const std::vector<AllocatorOp>& ops,
                                     std::optional<int64_t> capacity) {
  CudaAllocatorModel model(capacity);
  AllocatorReplay r;
  r.reserved.reserve(ops.size());
  r.allocated.reserve(ops.size());
  for (const AllocatorOp& op : ops) {
    switch (op.kind) {
      case AllocatorOp::kMalloc:
        model.free(op.id);  // no-op unless the trace missed its free
        if (!model.malloc(op.id, op.bytes, op.stream)) ++r.num_ooms;
        break;
      case AllocatorOp::kFree:
        model.free(op.id);
        break;
      case AllocatorOp::kReleaseCache:
        model.empty_cache();
        break;
    }
    r.reserved.push_back(model.reserved());
    r.allocated.push_back(model.allocated());
  }
  r.segments = model.segment_sizes();
  return r;
}

}  // namespace memfit
