#include "memfit/core/model/allocator_trace.h"

#include <gtest/gtest.h>

#include <vector>

namespace memfit {
namespace {

constexpr int64_t MiB = 1 << 20;

AllocatorOp malloc_op(uint64_t id, int64_t bytes, int64_t stream = 0) {
  return {AllocatorOp::kMalloc, id, bytes, stream};
}
AllocatorOp free_op(uint64_t id) { return {AllocatorOp::kFree, id, 0, 0}; }
AllocatorOp release_op() { return {AllocatorOp::kReleaseCache, 0, 0, 0}; }

// A front's column of op kinds is read by the core, which refuses a kind it
// does not know.
TEST(AllocatorTraceTest, AnOpKindFromAColumnIsCheckedByTheCore) {
  const AllocatorOp op = allocator_op(2, 7, 512, 1);
  EXPECT_EQ(op.kind, AllocatorOp::kReleaseCache);
  EXPECT_EQ(op.id, 7u);
  EXPECT_EQ(op.bytes, 512);
  EXPECT_EQ(op.stream, 1);
  EXPECT_THROW(allocator_op(3, 0, 0, 0), std::invalid_argument);
}

TEST(AllocatorTraceTest, ReservedAfterEachOpFollowsTheRules) {
  // 1000 B: a 2 MiB small segment; 3 MiB: a 20 MiB one, split; 16.5 MiB:
  // the 17 MiB rest, whole (0.5 MiB left is not split off); 11 MiB: a
  // segment of 12 MiB, whole; freed and released; 5 MiB: no free large
  // block is left, so a new 20 MiB segment.
  const auto r = replay_allocator_ops(
      {malloc_op(1, 1000), malloc_op(2, 3 * MiB), malloc_op(3, 16 * MiB + MiB / 2),
       malloc_op(4, 11 * MiB), free_op(4), release_op(), malloc_op(5, 5 * MiB)});
  EXPECT_EQ(r.reserved, (std::vector<int64_t>{2 * MiB, 22 * MiB, 22 * MiB, 34 * MiB,
                                              34 * MiB, 22 * MiB, 42 * MiB}));
  EXPECT_EQ(r.allocated, (std::vector<int64_t>{1024, 1024 + 3 * MiB, 1024 + 20 * MiB,
                                               1024 + 32 * MiB, 1024 + 20 * MiB,
                                               1024 + 20 * MiB, 1024 + 25 * MiB}));
  EXPECT_EQ(r.segments, (std::vector<int64_t>{2 * MiB, 20 * MiB, 20 * MiB}));
  EXPECT_EQ(r.num_ooms, 0);
}

TEST(AllocatorTraceTest, CachedBlocksServeOnlyTheirOwnStream) {
  const auto r = replay_allocator_ops(
      {malloc_op(1, 1000, 0), malloc_op(2, 1000, 7), free_op(1), malloc_op(3, 1000, 7)});
  // Stream 7 gets its own small segment, and reuses its own free space
  // rather than stream 0's freed block.
  EXPECT_EQ(r.reserved, (std::vector<int64_t>{2 * MiB, 4 * MiB, 4 * MiB, 4 * MiB}));
  EXPECT_EQ(r.segments, (std::vector<int64_t>{2 * MiB, 2 * MiB}));
}

TEST(AllocatorTraceTest, ReleaseKeepsSegmentsWithLiveBlocks) {
  const auto r = replay_allocator_ops(
      {malloc_op(1, 3 * MiB), malloc_op(2, 12 * MiB), free_op(2), release_op()});
  EXPECT_EQ(r.reserved.back(), 20 * MiB);  // the 12 MiB one went back, not the 20
  EXPECT_EQ(r.segments, (std::vector<int64_t>{20 * MiB}));
}

}  // namespace
}  // namespace memfit
