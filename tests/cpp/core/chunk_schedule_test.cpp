#include "memfit/core/model/chunk_schedule.h"

#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <vector>

namespace memfit {
namespace {

// The sizes of the chunks run when every one completes.
std::vector<int64_t> sizes_without_oom(ChunkSchedule s) {
  std::vector<int64_t> out;
  while (!s.done()) {
    out.push_back(s.next().size);
    s.succeeded();
  }
  return out;
}

TEST(ChunkScheduleTest, NoLimitRunsTheWholeBatch) {
  EXPECT_EQ(sizes_without_oom(ChunkSchedule(21, 0)),
            std::vector<int64_t>({21}));
  EXPECT_EQ(sizes_without_oom(ChunkSchedule(21, 40)),
            std::vector<int64_t>({21}));
}

TEST(ChunkScheduleTest, ChunksAreBalancedWithAtMostTheLimit) {
  EXPECT_EQ(sizes_without_oom(ChunkSchedule(21, 8)),
            std::vector<int64_t>({7, 7, 7}));
  EXPECT_EQ(sizes_without_oom(ChunkSchedule(10, 4)),
            std::vector<int64_t>({4, 3, 3}));
  EXPECT_EQ(sizes_without_oom(ChunkSchedule(8, 3)),
            std::vector<int64_t>({3, 3, 2}));
}

TEST(ChunkScheduleTest, AnOomHalvesTheSizeAndRedoesTheFailedChunk) {
  ChunkSchedule s(8, 4);
  s.succeeded();  // [0, 4)
  EXPECT_EQ(s.next().start, 4);
  EXPECT_TRUE(s.failed());
  EXPECT_EQ(s.position(), 4);  // moves on success only
  EXPECT_EQ(s.next().start, 4);
  EXPECT_EQ(s.next().size, 2);
  s.succeeded();
  EXPECT_EQ(s.next().start, 6);
  s.succeeded();
  EXPECT_TRUE(s.done());
  EXPECT_EQ(s.ooms_recovered(), 1);
  EXPECT_EQ(s.size(), 2);  // where the next step starts
}

TEST(ChunkScheduleTest, AFailedChunkIsRedoneBeforeAnySampleAfterIt) {
  // 7 fails, 3 at most: its samples in 3, 2, 2 (never past 7), then the rest.
  ChunkSchedule s(21, 7);
  ASSERT_TRUE(s.failed());
  std::vector<int64_t> sizes = sizes_without_oom(s);
  EXPECT_EQ(sizes, std::vector<int64_t>({3, 2, 2, 3, 3, 3, 3, 2}));
}

TEST(ChunkScheduleTest, AnOomInsideARedoIsRedoneInnermostFirst) {
  ChunkSchedule s(16, 8);
  ASSERT_TRUE(s.failed());  // [0, 8)
  ASSERT_TRUE(s.failed());  // [0, 4)
  std::vector<std::pair<int64_t, int64_t>> got;
  while (!s.done()) {
    got.emplace_back(s.next().start, s.next().size);
    s.succeeded();
  }
  const std::vector<std::pair<int64_t, int64_t>> want = {
      {0, 2}, {2, 2}, {4, 2}, {6, 2}, {8, 2}, {10, 2}, {12, 2}, {14, 2}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(s.ooms_recovered(), 2);
}

TEST(ChunkScheduleTest, OneSampleThatFailsEndsTheSchedule) {
  ChunkSchedule s(3, 1);
  EXPECT_FALSE(s.failed());
  EXPECT_EQ(s.ooms_recovered(), 0);
  ChunkSchedule halved(2, 0);
  EXPECT_TRUE(halved.failed());
  EXPECT_FALSE(halved.failed());
}

TEST(ChunkScheduleTest, WithoutSplittingTheFirstOomEndsTheSchedule) {
  ChunkSchedule s(8, 0, /*can_split=*/false);
  EXPECT_FALSE(s.failed());
  EXPECT_EQ(s.next().size, 8);
}

TEST(ChunkScheduleTest, RandomOomsNeitherLoseNorRepeatASample) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int64_t batch = 1 + static_cast<int64_t>(rng() % 200);
    const int64_t limit = static_cast<int64_t>(rng() % (batch + 2));
    ChunkSchedule s(batch, limit);
    int64_t covered = 0;
    int64_t size = s.size();
    while (!s.done()) {
      const Chunk c = s.next();
      ASSERT_EQ(c.start, covered);
      ASSERT_GE(c.size, 1);
      ASSERT_LE(c.size, size);
      ASSERT_LE(c.end(), batch);
      if (rng() % 3 == 0) {
        if (!s.failed()) {
          ASSERT_EQ(c.size, 1);
          break;
        }
        ASSERT_LT(s.size(), size);  // never grows back
        size = s.size();
        // The redo stays inside the failed chunk.
        ASSERT_LE(s.next().end(), c.end());
        continue;
      }
      s.succeeded();
      covered += c.size;
    }
    if (s.done()) {
      EXPECT_EQ(covered, batch) << "trial " << trial;
    } else {
      EXPECT_EQ(s.next().size, 1) << "trial " << trial;
    }
  }
}

TEST(ChunkScheduleTest, BadArgumentsAreRefused) {
  EXPECT_THROW(ChunkSchedule(0, 0), std::invalid_argument);
  EXPECT_THROW(ChunkSchedule(4, -1), std::invalid_argument);
}

}  // namespace
}  // namespace memfit
