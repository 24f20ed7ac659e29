#include "memfit/core/plan/batch_fit.h"

#include <gtest/gtest.h>

namespace memfit {
namespace {

// A multiple of 8 only where it costs at most an eighth of the batch.
TEST(RecommendedBatch, MultipleOfEightWhenCheap) {
  EXPECT_EQ(recommended_batch(0), 0);
  EXPECT_EQ(recommended_batch(5), 5);
  EXPECT_EQ(recommended_batch(8), 8);
  EXPECT_EQ(recommended_batch(9), 8);
  EXPECT_EQ(recommended_batch(12), 12);  // 8 would lose a third
  EXPECT_EQ(recommended_batch(63), 56);
  EXPECT_EQ(recommended_batch(64), 64);
  EXPECT_EQ(recommended_batch(1023), 1016);
}

}  // namespace
}  // namespace memfit
