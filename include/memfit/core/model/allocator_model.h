// PyTorch's CUDA caching allocator, replayed: logical allocations in,
// allocated (rounded) and reserved (cudaMalloc'd) bytes out.
// See Note [Caching allocator rules] in allocator_model.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "memfit/core/model/timeline.h"

namespace memfit {

// The allocator's constants (c10/cuda/CUDACachingAllocator.cpp).
inline constexpr int64_t kCudaMinBlockSize = 512;        // rounding unit
inline constexpr int64_t kCudaSmallSize = 1 << 20;       // small pool: <= 1 MiB
inline constexpr int64_t kCudaSmallBuffer = 2 << 20;     // small segment
inline constexpr int64_t kCudaLargeBuffer = 20 << 20;    // large segment
inline constexpr int64_t kCudaMinLargeAlloc = 10 << 20;  // below: 20 MiB seg.
inline constexpr int64_t kCudaRoundLarge = 2 << 20;      // large seg. rounding

// The request size the allocator works with: at least 512 B, rounded up to
// a multiple of 512 B.
int64_t cuda_round_size(int64_t bytes);
// The segment size cudaMalloc'd for a rounded request that no cached block
// can serve: 2 MiB (small pool), 20 MiB (under 10 MiB), else rounded up to
// 2 MiB.
int64_t cuda_segment_size(int64_t rounded_bytes);

// One device, one stream, default PYTORCH_CUDA_ALLOC_CONF. Not copyable
// (blocks point at each other); movable.
class CudaAllocatorModel {
 public:
  // `capacity`: bytes cudaMalloc may hand out in all (the device's free
  // memory); none means unlimited.
  explicit CudaAllocatorModel(std::optional<int64_t> capacity = {});
  CudaAllocatorModel(const CudaAllocatorModel&) = delete;
  CudaAllocatorModel& operator=(const CudaAllocatorModel&) = delete;
  CudaAllocatorModel(CudaAllocatorModel&&) = default;
  CudaAllocatorModel& operator=(CudaAllocatorModel&&) = default;

  // Allocates `bytes` under `id` on `stream` (cached blocks are reused on
  // the stream they were allocated on only). False is an OOM (nothing
  // changes but the release of wholly free cached segments it tried first).
  // Zero bytes reserve nothing, as in PyTorch. Throws std::invalid_argument
  // for negative bytes or an id that is still allocated.
  bool malloc(uint64_t id, int64_t bytes, int64_t stream = 0);
  // Returns `id`'s block to the cache; unknown ids are ignored.
  void free(uint64_t id);
  // Releases every cached segment that is wholly free
  // (torch.cuda.empty_cache()).
  void empty_cache();

  int64_t allocated() const { return allocated_; }  // sum of block sizes
  int64_t requested() const { return requested_; }  // sum of asked bytes
  int64_t reserved() const { return reserved_; }    // sum of segment sizes
  int64_t peak_allocated() const { return peak_allocated_; }
  int64_t peak_reserved() const { return peak_reserved_; }
  int num_segments() const { return num_segments_; }
  int num_ooms() const { return num_ooms_; }
  // The size of each segment held now, ascending.
  std::vector<int64_t> segment_sizes() const;

 private:
  struct Block {
    int64_t size = 0;
    int64_t requested = 0;  // bytes asked for, while allocated
    uint64_t address = 0;   // simulated; orders equal-size blocks
    int64_t stream = 0;
    bool small = false;
    bool allocated = false;
    Block* prev = nullptr;  // neighbours in the same segment
    Block* next = nullptr;
  };
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const {
      if (a->stream != b->stream) return a->stream < b->stream;
      return a->size != b->size ? a->size < b->size : a->address < b->address;
    }
  };
  using Pool = std::set<Block*, BySizeThenAddress>;

  Block* new_block();
  void recycle(Block* b);
  Block* take_best_fit(Pool& pool, int64_t size, int64_t stream);
  Block* new_segment(int64_t size, bool small, int64_t stream);
  void release_free_segments(Pool& pool);
  void merge_into(Block* dst, Block* src, Pool& pool);

  std::optional<int64_t> capacity_;
  Pool small_pool_;
  Pool large_pool_;
  std::unordered_map<uint64_t, Block*> live_;  // nullptr for 0-byte ones
  std::deque<Block> storage_;  // stable addresses for every Block
  std::vector<Block*> spare_;  // recycled entries of storage_
  uint64_t next_address_ = 0;
  int64_t allocated_ = 0;
  int64_t requested_ = 0;
  int64_t reserved_ = 0;
  int64_t peak_allocated_ = 0;
  int64_t peak_reserved_ = 0;
  int num_segments_ = 0;
  int num_ooms_ = 0;
};

struct CudaReplay {
  int64_t peak_allocated = 0;
  int64_t peak_reserved = 0;              // includes fixed_overhead_bytes
  size_t peak_reserved_event = kNoEvent;  // first event reaching it
  int num_ooms = 0;                       // allocations that did not fit
  size_t first_oom_event = kNoEvent;
};

// cuBLASLt's workspace, one block of the small pool: of a card's fixed
// workspace bytes the replay allocates it, and holds the rest aside. See
// Note [cuBLASLt's block in the replay] (allocator_model.cpp).
inline constexpr int64_t kCublasLtWorkspaceBytes = 1 << 20;
// The part of `workspace_bytes` held aside from the replayed allocator: all
// of it, less cuBLASLt's 2 MiB segment where it is that large.
int64_t cuda_workspace_held(int64_t workspace_bytes);
// The part counted as allocated: the held bytes and cuBLASLt's block.
int64_t cuda_workspace_allocated(int64_t workspace_bytes);
// The event before which the replay takes cuBLASLt's block: the first of
// the timeline's forward phase, 0 where it has none.
size_t cublaslt_event(const Timeline& timeline);

// Replays the timeline's allocs and frees (every device, in order) through
// a CudaAllocatorModel. `fixed_overhead_bytes` (cuBLAS workspace, ...) is
// held from the start: it counts against `capacity` and is included in
// peak_reserved, not in peak_allocated, except cuBLASLt's block, which the
// replay allocates before its forward (cublaslt_event) where the overhead
// includes its 2 MiB: see Note [cuBLASLt's block in the replay]. An
// allocation that does not fit is counted as an OOM and skipped (its free
// is then ignored), so one replay reports how many allocations would fail.
// Throws std::invalid_argument for a negative overhead or capacity.
CudaReplay replay_cuda(const Timeline& timeline,
                       std::optional<int64_t> capacity = {},
                       int64_t fixed_overhead_bytes = 0);
// The same, on events that no Timeline holds (a step synthesized at a batch
// no step ran at: reserve_interpolation.h), cuBLASLt's block taken before
// event `cublaslt_at`.
CudaReplay replay_cuda(const std::vector<Event>& events,
                       std::optional<int64_t> capacity = {},
                       int64_t fixed_overhead_bytes = 0, size_t cublaslt_at = 0);
// The reserved bytes after each of the timeline's events in the replay above
// (no capacity; the held-aside part of `fixed_overhead_bytes` not included,
// cuBLASLt's block included from its event on): the column Snapshot.compare
// sets beside a card's trace, so the two replay one way.
std::vector<int64_t> cuda_reserved_after(const Timeline& timeline,
                                         int64_t fixed_overhead_bytes);

}  // namespace memfit
