#include "memfit/core/model/chunk_coverage.h"

#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <vector>

namespace memfit {
namespace {

using Items = std::vector<size_t>;

TEST(ChunkCoverageTest, EveryItemOwesTheFirstChunk) {
  ChunkCoverage c(3);
  EXPECT_EQ(c.owed({0, 4}), Items({0, 1, 2}));
  c.add({0, 4}, {0, 1, 2});
  EXPECT_EQ(c.owed({4, 4}), Items({0, 1, 2}));
  EXPECT_EQ(c.owed({0, 4}), Items());
}

TEST(ChunkCoverageTest, ARedoOwesOnlyWhatTheFailedChunkDidNotAdd) {
  ChunkCoverage c(3);
  c.add({0, 8}, {2});  // item 2 got its share before the OOM
  EXPECT_EQ(c.owed({0, 4}), Items({0, 1}));
  c.add({0, 4}, {0, 1});
  EXPECT_EQ(c.owed({4, 4}), Items({0, 1}));
  c.add({4, 4}, {0, 1});
  EXPECT_EQ(c.owed({8, 4}), Items({0, 1, 2}));  // all at 8 again
}

TEST(ChunkCoverageTest, AddingAShareThatIsNotOwedIsRefused) {
  ChunkCoverage c(2);
  c.add({0, 4}, {0});
  EXPECT_THROW(c.add({0, 4}, {0}), std::logic_error);
  EXPECT_THROW(c.add({0, 4}, {5}), std::logic_error);
}

// The schedule and the coverage together: OOMs that strike after a random
// part of the owed items received their share still add each sample to
// each item exactly once.
TEST(ChunkCoverageTest, WithTheScheduleEverySampleCountsOncePerItem) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t batch = 1 + static_cast<int64_t>(rng() % 64);
    const size_t items = 1 + rng() % 5;
    ChunkSchedule s(batch, static_cast<int64_t>(rng() % (batch + 1)));
    ChunkCoverage c(items);
    std::vector<std::vector<int>> counted(items, std::vector<int>(batch, 0));
    auto add = [&](const Chunk& chunk, const Items& which) {
      c.add(chunk, which);
      for (size_t i : which) {
        for (int64_t k = chunk.start; k < chunk.end(); ++k) ++counted[i][k];
      }
    };
    while (!s.done()) {
      const Chunk chunk = s.next();
      const Items owed = c.owed(chunk);
      if (chunk.size > 1 && rng() % 3 == 0) {
        Items part;
        for (size_t i : owed) {
          if (rng() % 2) part.push_back(i);
        }
        add(chunk, part);
        ASSERT_TRUE(s.failed());
        continue;
      }
      add(chunk, owed);
      s.succeeded();
    }
    for (size_t i = 0; i < items; ++i) {
      for (int64_t k = 0; k < batch; ++k) ASSERT_EQ(counted[i][k], 1) << trial;
    }
  }
}

}  // namespace
}  // namespace memfit
