#include "memfit/torch/recorder.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace memfit {
namespace {

std::vector<int64_t> transients(const Timeline& tl, const std::string& what) {
  std::vector<int64_t> bytes;
  for (const Event& e : tl.events()) {
    if (e.kind == EventKind::kAlloc && e.bytes > 0 && tl.op_name(e.op) == what) {
      EXPECT_EQ(e.category, Category::kTemporary);
      bytes.push_back(e.bytes);
    }
  }
  return bytes;
}

const std::string kStaging = "CUDA reduction's staging buffer";

TEST(CardOpsTest, SumOverTheBatchAddsTheCardsStagingBuffer) {
  torch::NoGradGuard no_grad;
  auto g = torch::ones({1024, 512});
  Recorder r;
  r.add_card_kernels();
  auto bias = g.sum(0);
  r.stop();
  EXPECT_EQ(transients(r.timeline(), kStaging), (std::vector<int64_t>{4 << 20, 16}));
  // Freed again: the output alone stays.
  EXPECT_EQ(r.live_bytes(), 512 * 4);
  EXPECT_EQ(r.peak_bytes(), 512 * 4 + (4 << 20));
}

TEST(CardOpsTest, OnMetaTooAndOnlyWhenAsked) {
  torch::NoGradGuard no_grad;
  auto g = torch::ones({1024, 512}, torch::kMeta);
  {
    Recorder r;
    r.drop_meta_kernel_intermediates();
    r.add_card_kernels();
    auto bias = g.sum(0);
    r.stop();
    EXPECT_EQ(transients(r.timeline(), kStaging).size(), 2u);
  }
  Recorder plain;
  auto bias = g.sum(0);
  plain.stop();
  EXPECT_TRUE(transients(plain.timeline(), kStaging).empty());
}

// Nothing, as two empty allocations: a step at any batch makes the same
// allocations (steps_align).
TEST(CardOpsTest, SmallSumAddsNothing) {
  torch::NoGradGuard no_grad;
  auto g = torch::ones({64, 512});
  Recorder r;
  r.add_card_kernels();
  auto bias = g.sum(0);
  r.stop();
  EXPECT_TRUE(transients(r.timeline(), kStaging).empty());
  int empty = 0;
  for (const Event& e : r.timeline().events()) {
    empty += e.kind == EventKind::kAlloc && r.timeline().op_name(e.op) == kStaging;
  }
  EXPECT_EQ(empty, 2);
  EXPECT_EQ(r.peak_bytes(), 512 * 4);
}

}  // namespace
}  // namespace memfit
