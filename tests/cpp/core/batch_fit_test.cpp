#include "memfit/core/plan/batch_fit.h"

#include <gtest/gtest.h>

namespace memfit {
namespace {

// The names fit_batch's advice and the report's notes read.
TEST(OptimizerNames, AdamAndHostOffload) {
  for (const char* adam : {"adam", "Adam", "AdamW", "adam-offload", "Adam-offload"}) {
    EXPECT_TRUE(optimizer_is_adam(adam)) << adam;
  }
  for (const char* other : {"sgd", "momentum", "SGD", "none"}) {
    EXPECT_FALSE(optimizer_is_adam(other)) << other;
  }
  EXPECT_TRUE(optimizer_on_host("adam-offload"));
  EXPECT_TRUE(optimizer_on_host("Adam-offload"));
  for (const char* on_device : {"adam", "-offload", "offload", "adam-offloaded"}) {
    EXPECT_FALSE(optimizer_on_host(on_device)) << on_device;
  }
}

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
