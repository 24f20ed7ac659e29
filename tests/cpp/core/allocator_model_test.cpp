#include "memfit/core/model/allocator_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "memfit/core/model/report.h"

namespace memfit {
namespace {

constexpr int64_t KiB = 1024;
constexpr int64_t MiB = 1024 * 1024;

TEST(CudaRoundingTest, RequestsRoundUpTo512Bytes) {
  EXPECT_EQ(cuda_round_size(0), 512);
  EXPECT_EQ(cuda_round_size(1), 512);
  EXPECT_EQ(cuda_round_size(512), 512);
  EXPECT_EQ(cuda_round_size(513), 1024);
  EXPECT_EQ(cuda_round_size(MiB + 1), MiB + 512);
}

TEST(CudaRoundingTest, SegmentSizes) {
  EXPECT_EQ(cuda_segment_size(512), 2 * MiB);
  EXPECT_EQ(cuda_segment_size(MiB), 2 * MiB);
  EXPECT_EQ(cuda_segment_size(MiB + 512), 20 * MiB);
  EXPECT_EQ(cuda_segment_size(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(cuda_segment_size(10 * MiB), 10 * MiB);
  EXPECT_EQ(cuda_segment_size(11 * MiB), 12 * MiB);
  EXPECT_EQ(cuda_segment_size(12 * MiB + 1), 14 * MiB);
}

TEST(CudaAllocatorModelTest, SmallRequestRoundsTo512AndReservesTwoMiB) {
  CudaAllocatorModel m;
  ASSERT_TRUE(m.malloc(1, 100));
  EXPECT_EQ(m.allocated(), 512);
  EXPECT_EQ(m.requested(), 100);
  EXPECT_EQ(m.reserved(), 2 * MiB);
  EXPECT_EQ(m.num_segments(), 1);
}

TEST(CudaAllocatorModelTest, TwoOneMiBAllocationsShareOneSmallSegment) {
  CudaAllocatorModel m;
  ASSERT_TRUE(m.malloc(1, MiB));
  ASSERT_TRUE(m.malloc(2, MiB));
  EXPECT_EQ(m.allocated(), 2 * MiB);
  EXPECT_EQ(m.reserved(), 2 * MiB);
  EXPECT_EQ(m.num_segments(), 1);
  ASSERT_TRUE(m.malloc(3, MiB));  // the segment is full
  EXPECT_EQ(m.reserved(), 4 * MiB);
  EXPECT_EQ(m.num_segments(), 2);
}

TEST(CudaAllocatorModelTest, MidSizeRequestGetsATwentyMiBSegment) {
  CudaAllocatorModel m;
  ASSERT_TRUE(m.malloc(1, MiB + MiB / 2));
  EXPECT_EQ(m.allocated(), MiB + MiB / 2);
  EXPECT_EQ(m.reserved(), 20 * MiB);
}

TEST(CudaAllocatorModelTest,
     LargeRequestWithSmallRemainderTakesTheWholeSegment) {
  // 11 MiB -> a 12 MiB segment; the 1 MiB remainder is not > 1 MiB, so it
  // is not split off and the whole 12 MiB counts as allocated.
  CudaAllocatorModel m;
  ASSERT_TRUE(m.malloc(1, 11 * MiB));
  EXPECT_EQ(m.reserved(), 12 * MiB);
  EXPECT_EQ(m.allocated(), 12 * MiB);
  EXPECT_EQ(m.requested(), 11 * MiB);
}

TEST(CudaAllocatorModelTest, TenMiBGetsItsOwnSegmentBelowItATwentyMiBOne) {
  CudaAllocatorModel a;
  ASSERT_TRUE(a.malloc(1, 10 * MiB));
  EXPECT_EQ(a.reserved(), 10 * MiB);
  CudaAllocatorModel b;
  ASSERT_TRUE(b.malloc(1, 9 * MiB + MiB / 2));
  EXPECT_EQ(b.reserved(), 20 * MiB);
  EXPECT_EQ(b.allocated(), 9 * MiB + MiB / 2);
}

TEST(CudaAllocatorModelTest, FreedBlockIsReusedWithoutNewReserve) {
  CudaAllocatorModel m;
  ASSERT_TRUE(m.malloc(1, MiB + MiB / 2));
  m.free(1);
  EXPECT_EQ(m.allocated(), 0);
  EXPECT_EQ(m.reserved(), 20 * MiB);
  ASSERT_TRUE(m.malloc(2, 3 * MiB));
  EXPECT_EQ(m.allocated(), 3 * MiB);
  EXPECT_EQ(m.reserved(), 20 * MiB);
  EXPECT_EQ(m.num_segments(), 1);
  EXPECT_EQ(m.peak_allocated(), 3 * MiB);
  EXPECT_EQ(m.peak_reserved(), 20 * MiB);
}

TEST(CudaAllocatorModelTest, LargePoolHandsOutUpToOneMiBOfSlack) {
  CudaAllocatorModel m;
  ASSERT_TRUE(m.malloc(1, MiB + MiB / 2));  // leaves 18.5 MiB free
  ASSERT_TRUE(m.malloc(2, 18 * MiB));       // remainder 0.5 MiB: not split
  EXPECT_EQ(m.allocated(), 20 * MiB);
  EXPECT_EQ(m.reserved(), 20 * MiB);

  CudaAllocatorModel n;
  ASSERT_TRUE(n.malloc(1, MiB + MiB / 2));
  ASSERT_TRUE(n.malloc(2, 17 * MiB));  // remainder 1.5 MiB: split
  EXPECT_EQ(n.allocated(), 18 * MiB + MiB / 2);
}

TEST(CudaAllocatorModelTest, BestFitPicksTheSmallestBlockThatFits) {
  CudaAllocatorModel m;
  ASSERT_TRUE(m.malloc(1, 12 * MiB));       // own 12 MiB segment
  ASSERT_TRUE(m.malloc(2, MiB + MiB / 2));  // 20 MiB segment, 18.5 free
  m.free(1);
  // Free blocks: 12 MiB and 18.5 MiB. 11 MiB takes the 12 MiB one whole
  // (1 MiB remainder, not split); the 18.5 MiB block would have been split
  // to exactly 11 MiB.
  ASSERT_TRUE(m.malloc(3, 11 * MiB));
  EXPECT_EQ(m.allocated(), MiB + MiB / 2 + 12 * MiB);
  EXPECT_EQ(m.reserved(), 32 * MiB);
}

TEST(CudaAllocatorModelTest, SmallPoolSplitsDownTo512Bytes) {
  CudaAllocatorModel m;
  ASSERT_TRUE(m.malloc(1, MiB - 512));  // remainder MiB + 512: split
  ASSERT_TRUE(m.malloc(2, MiB));        // remainder 512: still split
  EXPECT_EQ(m.allocated(), 2 * MiB - 512);
  ASSERT_TRUE(m.malloc(3, 1));  // the last 512 B
  EXPECT_EQ(m.allocated(), 2 * MiB);
  EXPECT_EQ(m.reserved(), 2 * MiB);
  EXPECT_EQ(m.num_segments(), 1);
}

TEST(CudaAllocatorModelTest, PoolsDoNotLendToEachOther) {
  CudaAllocatorModel m;
  ASSERT_TRUE(m.malloc(1, MiB + MiB / 2));  // large pool, 18.5 MiB free
  ASSERT_TRUE(m.malloc(2, 4 * KiB));        // small pool: new 2 MiB segment
  EXPECT_EQ(m.reserved(), 22 * MiB);
  EXPECT_EQ(m.num_segments(), 2);
}

TEST(CudaAllocatorModelTest, FreedNeighboursMergeSoTheSegmentCanBeReleased) {
  for (int order = 0; order < 3; ++order) {
    SCOPED_TRACE(order);
    CudaAllocatorModel m;
    ASSERT_TRUE(m.malloc(1, 2 * MiB));
    ASSERT_TRUE(m.malloc(2, 2 * MiB));
    ASSERT_TRUE(m.malloc(3, 2 * MiB));
    const uint64_t frees[3][3] = {{1, 2, 3}, {3, 2, 1}, {1, 3, 2}};
    for (uint64_t id : frees[order]) m.free(id);
    m.empty_cache();
    EXPECT_EQ(m.reserved(), 0);
    EXPECT_EQ(m.num_segments(), 0);
  }
}

TEST(CudaAllocatorModelTest, PartlyUsedSegmentIsNotReleased) {
  CudaAllocatorModel m;
  ASSERT_TRUE(m.malloc(1, 2 * MiB));
  ASSERT_TRUE(m.malloc(2, 2 * MiB));
  m.free(1);
  m.empty_cache();
  EXPECT_EQ(m.reserved(), 20 * MiB);
  // Best fit: the 2 MiB hole in front takes a 2 MiB request, which leaves
  // the 16 MiB tail whole for a 16 MiB one.
  ASSERT_TRUE(m.malloc(3, 2 * MiB));
  ASSERT_TRUE(m.malloc(4, 16 * MiB));
  EXPECT_EQ(m.reserved(), 20 * MiB);
  EXPECT_EQ(m.allocated(), 20 * MiB);
}

TEST(CudaAllocatorModelTest, CapacityReleasesCachedSegmentsThenRetries) {
  CudaAllocatorModel m(40 * MiB);
  ASSERT_TRUE(m.malloc(1, MiB + MiB / 2));
  ASSERT_TRUE(m.malloc(2, MiB + MiB / 2));
  m.free(1);
  m.free(2);  // the 20 MiB segment is wholly free again, but cached
  EXPECT_EQ(m.reserved(), 20 * MiB);
  ASSERT_TRUE(m.malloc(3, 30 * MiB));  // 20 + 30 > 40: release, retry
  EXPECT_EQ(m.reserved(), 30 * MiB);
  EXPECT_EQ(m.allocated(), 30 * MiB);
  EXPECT_EQ(m.num_segments(), 1);
  EXPECT_EQ(m.peak_reserved(), 30 * MiB);
  EXPECT_EQ(m.num_ooms(), 0);
}

TEST(CudaAllocatorModelTest, ReleaseFreesOnlyWhatIsWhollyFreeInBothPools) {
  CudaAllocatorModel m(40 * MiB);
  ASSERT_TRUE(m.malloc(1, 100));  // small segment, 2 MiB
  m.free(1);
  ASSERT_TRUE(m.malloc(2, MiB + MiB / 2));  // 20 MiB segment, in use
  EXPECT_EQ(m.reserved(), 22 * MiB);
  ASSERT_TRUE(m.malloc(3, 20 * MiB));  // 42 > 40: the small one goes
  EXPECT_EQ(m.reserved(), 40 * MiB);
  EXPECT_EQ(m.num_segments(), 2);
  EXPECT_EQ(m.peak_reserved(), 40 * MiB);
}

TEST(CudaAllocatorModelTest, OomWhenEvenReleasingCachedSegmentsIsNotEnough) {
  CudaAllocatorModel m(40 * MiB);
  ASSERT_TRUE(m.malloc(1, MiB + MiB / 2));  // 20 MiB segment, split: kept
  EXPECT_FALSE(m.malloc(2, 30 * MiB));
  EXPECT_EQ(m.num_ooms(), 1);
  EXPECT_EQ(m.reserved(), 20 * MiB);
  EXPECT_EQ(m.allocated(), MiB + MiB / 2);
  m.free(2);  // never allocated: ignored
  EXPECT_EQ(m.allocated(), MiB + MiB / 2);
  ASSERT_TRUE(m.malloc(2, MiB));  // the id is free to use
  EXPECT_EQ(m.reserved(), 22 * MiB);
}

TEST(CudaAllocatorModelTest, ZeroBytesReserveNothing) {
  CudaAllocatorModel m;
  ASSERT_TRUE(m.malloc(1, 0));
  EXPECT_EQ(m.allocated(), 0);
  EXPECT_EQ(m.reserved(), 0);
  m.free(1);
  ASSERT_TRUE(m.malloc(1, 0));
}

TEST(CudaAllocatorModelTest, MisuseThrows) {
  CudaAllocatorModel m;
  EXPECT_THROW(m.malloc(1, -1), std::invalid_argument);
  ASSERT_TRUE(m.malloc(1, 10));
  try {
    m.malloc(1, 10);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "[CudaAllocatorModel::malloc] id 1 is still allocated: free it "
              "first or use a new id");
  }
  EXPECT_THROW(CudaAllocatorModel(-1), std::invalid_argument);
}

// e0 alloc 1: 100 B      small segment 2 MiB
// e1 alloc 2: 1.5 MiB    large segment 20 MiB
// e2 free 1
// e3 alloc 3: 11 MiB     fits the 18.5 MiB free block (split)
// e4 free 2
// e5 alloc 4: 1 MiB      reuses the small segment
Timeline replay_timeline() {
  Timeline t;
  auto add = [&t](EventKind kind, uint64_t id, int64_t bytes) {
    Event e;
    e.kind = kind;
    e.id = id;
    e.bytes = bytes;
    e.device = Device::kCUDA;
    t.record(e);
  };
  add(EventKind::kAlloc, 1, 100);
  add(EventKind::kAlloc, 2, MiB + MiB / 2);
  add(EventKind::kFree, 1, 0);
  add(EventKind::kAlloc, 3, 11 * MiB);
  add(EventKind::kFree, 2, 0);
  add(EventKind::kFree, 1000, 0);  // unknown: dropped by the timeline
  add(EventKind::kAlloc, 4, MiB);
  return t;
}

TEST(ReplayCudaTest, PeaksOfAllocatedAndReserved) {
  const CudaReplay r = replay_cuda(replay_timeline());
  EXPECT_EQ(r.peak_allocated, 12 * MiB + MiB / 2);
  EXPECT_EQ(r.peak_reserved, 22 * MiB);
  EXPECT_EQ(r.peak_reserved_event, 1u);
  EXPECT_EQ(r.num_ooms, 0);
  EXPECT_EQ(r.first_oom_event, kNoEvent);
}

TEST(ReplayCudaTest, FixedOverheadAddsToReservedOnly) {
  const CudaReplay r = replay_cuda(replay_timeline(), std::nullopt, MiB);
  EXPECT_EQ(r.peak_allocated, 12 * MiB + MiB / 2);
  EXPECT_EQ(r.peak_reserved, 23 * MiB);
}

TEST(ReplayCudaTest, CapacityMinusOverheadBoundsReservedAndCountsOoms) {
  // 21 MiB - 1 MiB overhead = 20 MiB usable: the 20 MiB segment for e1
  // does not fit beside the small one, which is in use.
  const CudaReplay r = replay_cuda(replay_timeline(), 21 * MiB, MiB);
  EXPECT_EQ(r.num_ooms, 1);
  EXPECT_EQ(r.first_oom_event, 1u);
  // e3 then gets its own 12 MiB segment: 2 + 12 MiB.
  EXPECT_EQ(r.peak_reserved, 15 * MiB);
  EXPECT_EQ(r.peak_reserved_event, 3u);
  EXPECT_EQ(r.peak_allocated, 13 * MiB);
  EXPECT_THROW(replay_cuda(replay_timeline(), std::nullopt, -1),
               std::invalid_argument);
}

// Two 768 KiB parameters share a small segment (512 KiB free); the forward
// takes 512 KiB and 1 MiB. See Note [cuBLASLt's block in the replay].
Timeline cublaslt_timeline() {
  Timeline t;
  uint64_t id = 0;
  auto alloc = [&t, &id](int64_t bytes) {
    Event e;
    e.kind = EventKind::kAlloc;
    e.id = ++id;
    e.bytes = bytes;
    e.device = Device::kCUDA;
    e.phase = t.current_phase();
    t.record(e);
  };
  t.begin_phase("parameters", 1);
  alloc(768 * KiB);
  alloc(768 * KiB);
  t.begin_phase("forward", 1);
  alloc(512 * KiB);
  alloc(MiB);
  t.end_phase();
  return t;
}

TEST(ReplayCudaTest, CublasLtBlockIsASmallBlockTakenAtTheForward) {
  const Timeline t = cublaslt_timeline();
  EXPECT_EQ(cublaslt_event(t), 2u);
  // 66 MiB: 64 MiB held aside, cuBLASLt's 1 MiB in a segment of its own
  // (the parameters' has 512 KiB free), where the 512 KiB block takes the
  // parameters' free 512 KiB and the 1 MiB block the other half of
  // cuBLASLt's: two small segments. Held flat, the step needed the same
  // two and 2 MiB more beside them.
  const CudaReplay r = replay_cuda(t, std::nullopt, kDefaultCudaWorkspaceBytes);
  EXPECT_EQ(r.peak_reserved, 4 * MiB + 64 * MiB);
  EXPECT_EQ(r.peak_allocated, 3 * MiB + MiB);
  EXPECT_EQ(r.peak_reserved_event, 2u);  // cuBLASLt's segment, taken before it
  const CudaEstimate c = estimate_cuda(t, kDefaultCudaWorkspaceBytes);
  EXPECT_EQ(c.peak_allocated, 4 * MiB + 64 * MiB);
  EXPECT_EQ(c.peak_reserved, 68 * MiB);
  EXPECT_EQ(c.workspace_bytes, 66 * MiB);
  EXPECT_EQ(cuda_workspace_allocated(kDefaultCudaWorkspaceBytes), 65 * MiB);
  EXPECT_EQ(cuda_workspace_held(kDefaultCudaWorkspaceBytes), 64 * MiB);
  // Taken first instead, cuBLASLt's block would leave the parameters'
  // second block a segment of its own, and the 1 MiB block a third.
  EXPECT_EQ(replay_cuda(t.events(), std::nullopt, kDefaultCudaWorkspaceBytes, 0).peak_reserved,
            6 * MiB + 64 * MiB);
  // Under 2 MiB the overhead is held aside whole, as before.
  EXPECT_EQ(cuda_workspace_allocated(MiB), MiB);
  EXPECT_EQ(replay_cuda(t, std::nullopt, MiB).peak_reserved, 4 * MiB + MiB);
}

TEST(ReplayCudaTest, ReservedAfterEachEventIsTheReplaysOwn) {
  const Timeline t = cublaslt_timeline();
  const std::vector<int64_t> after = cuda_reserved_after(t, kDefaultCudaWorkspaceBytes);
  ASSERT_EQ(after.size(), t.events().size());
  // cuBLASLt's segment is taken before event 2, so from there on the
  // column holds its 2 MiB; its top is the replay's peak less the 64 MiB
  // held aside.
  EXPECT_EQ(after[2] - after[1], 2 * MiB);
  EXPECT_EQ(*std::max_element(after.begin(), after.end()),
            replay_cuda(t, std::nullopt, kDefaultCudaWorkspaceBytes).peak_reserved -
                cuda_workspace_held(kDefaultCudaWorkspaceBytes));
}

TEST(ReplayCudaTest, EmptyTimeline) {
  const CudaReplay r = replay_cuda(Timeline());
  EXPECT_EQ(r.peak_allocated, 0);
  EXPECT_EQ(r.peak_reserved, 0);
  EXPECT_EQ(r.peak_reserved_event, kNoEvent);
}

}  // namespace
}  // namespace memfit
