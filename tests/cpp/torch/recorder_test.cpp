#include "memfit/torch/recorder.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace memfit {
namespace {

TEST(RecorderTest, EventsCarryPhaseModuleAndOp) {
  Recorder r;
  r.begin_phase("forward", 1);
  torch::Tensor out;
  {
    ModuleScope encoder("encoder");
    ModuleScope layer("0");
    out = torch::mm(torch::ones({4, 8}), torch::ones({8, 2}));
  }
  r.end_phase();
  const uint64_t out_id = tracking::allocation_of(out)->id;
  r.stop();
  const Timeline& tl = r.timeline();
  const Event* found = nullptr;
  for (const Event& e : tl.events()) {
    if (e.id == out_id && e.kind == EventKind::kAlloc) found = &e;
  }
  ASSERT_NE(found, nullptr);
  const Event& last = *found;
  EXPECT_EQ(last.bytes, 4 * 2 * 4);
  EXPECT_EQ(tl.module_name(last.module), "encoder.0");
  EXPECT_EQ(tl.phase_name(last.phase), "forward");
  EXPECT_EQ(tl.op_name(last.op), "aten::mm");
  EXPECT_EQ(last.category, Category::kActivation);
}

TEST(RecorderTest, AllocationFreedInsideItsOpIsTemporary) {
  torch::NoGradGuard no_grad;
  auto x = torch::randn({4, 1000});
  Recorder r;
  auto y = at::layer_norm(x, {1000});
  r.stop();
  // layer_norm keeps its output; native_layer_norm's mean and rstd (4 floats
  // each) die before layer_norm returns.
  const Timeline& tl = r.timeline();
  int64_t temporary = 0, kept = 0;
  for (const Event& e : tl.events()) {
    if (e.kind != EventKind::kAlloc) continue;
    if (tl.category_of(e.id) == Category::kTemporary) temporary += e.bytes;
    if (tl.is_live(e.id)) kept += e.bytes;
  }
  EXPECT_EQ(kept, 4 * 1000 * 4);
  EXPECT_EQ(temporary, 2 * 4 * 4);
}

TEST(RecorderTest, OnlyDeviceLeavesOtherDevicesAllocationsOut) {
  Recorder r;
  r.only_device(Device::kMeta);
  auto host = torch::ones({16});
  auto meta = torch::empty({8, 4}, torch::TensorOptions().device(torch::kMeta));
  host.reset();
  r.stop();
  const Timeline& tl = r.timeline();
  ASSERT_EQ(tl.events().size(), 1u);
  EXPECT_EQ(tl.events()[0].device, Device::kMeta);
  EXPECT_EQ(tl.events()[0].bytes, 8 * 4 * 4);
  EXPECT_EQ(r.live_bytes(), 8 * 4 * 4);
}

TEST(RecorderTest, SaysWhichOpsSizedTheirOutputByTheValues) {
  Recorder r;
  auto x = torch::tensor({3, 1, 3, 2});
  auto mm = torch::mm(torch::ones({2, 2}), torch::ones({2, 2}));
  EXPECT_TRUE(r.value_sized_ops().empty());
  auto u = at::_unique2(x);
  auto nz = torch::nonzero(x > 1);
  auto again = at::_unique2(x);
  r.stop();
  auto after = torch::nonzero(x);  // after stop(): not this recording's
  EXPECT_EQ(r.value_sized_ops(),
            (std::vector<std::string>{"aten::_unique2", "aten::nonzero"}));
}

TEST(RecorderTest, ClassifyChangesTheCategory) {
  Recorder r;
  r.begin_phase("forward");
  auto t = torch::ones({16});
  EXPECT_TRUE(r.classify(t, Category::kBuffer));
  r.stop();
  EXPECT_EQ(r.timeline().category_of(r.timeline().events().back().id),
            Category::kBuffer);
  EXPECT_FALSE(r.classify(torch::Tensor(), Category::kBuffer));
}

TEST(RecorderTest, OptimizerStepBuffersFreedInThePhaseAreTemporaries) {
  Recorder r;
  r.begin_phase("optimizer_step");
  auto state = torch::zeros({100});  // kept: optimizer state
  { auto scratch = torch::ones({50}); }  // dies within the phase
  r.end_phase();
  r.stop();
  const Timeline& tl = r.timeline();
  auto b = tl.breakdown_after(tl.peak().event_index);
  EXPECT_EQ(b.by_category[static_cast<int>(Category::kOptimizerState)], 400);
  EXPECT_EQ(b.by_category[static_cast<int>(Category::kTemporary)], 200);
}

TEST(RecorderTest, LiveBytesReturnToStartAfterForwardBackwardOfSmallModel) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(32, 64), torch::nn::ReLU(),
                              torch::nn::Linear(64, 4));
  Recorder r;
  const int64_t start = r.live_bytes();
  for (int i = 0; i < 2; ++i) {
    auto x = torch::randn({16, 32});
    auto y = torch::randint(0, 4, {16});
    auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    EXPECT_GT(r.peak_bytes(), 0);
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  }
  EXPECT_EQ(r.live_bytes(), start);
}

}  // namespace
}  // namespace memfit
