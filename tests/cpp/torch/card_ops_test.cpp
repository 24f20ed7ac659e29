#include "memfit/torch/recorder.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "memfit/core/model/card_kernels.h"
#include "memfit/torch/card_ops.h"
#include "memfit/torch/models.h"
#include "memfit/torch/profile.h"

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

// A 3x3 convolution on [1, 1, 8, 8]: x 64, y and dy 36 (6x6), w 9
// elements, 4 B x (9/4 (64 + 36) + 4 x 9) = 1044 B in its forward and in its
// backward (Note [cuDNN's convolution workspace]), said and not added: an
// empty mark at each op, the forward's first.
TEST(CardOpsTest, AConvolutionsForwardAndBackwardMarkTheirWorkspaceBoundsWithoutAddingThem) {
  auto x = torch::randn({1, 1, 8, 8}, torch::requires_grad());
  auto w = torch::randn({1, 1, 3, 3}, torch::requires_grad());
  Recorder r;
  r.add_card_kernels();
  auto y = torch::conv2d(x, w);
  y.backward(torch::ones_like(y));
  EXPECT_EQ(impl::take_conv_workspaces(&r), (std::vector<int64_t>{1044, 1044}));
  EXPECT_TRUE(impl::take_conv_workspaces(&r).empty());  // taken
  r.stop();
  int marks = 0;
  for (const Event& e : r.timeline().events()) {
    if (e.kind == EventKind::kAlloc && r.timeline().op_name(e.op) == kCudnnWorkspaceMark) {
      EXPECT_EQ(e.bytes, 0);
      ++marks;
    }
  }
  EXPECT_EQ(marks, 2);
}

// A 3x3 convolution, 16 channels in and out, padded, on [4, 16, 16, 16]:
// for a card the recording holds its outputs alone, y and its gradient's
// seed (65536 B each), x's gradient (65536 B) and w's (16 x 16 x 9 floats,
// 9216 B); what oneDNN's kernels take inside the ops is the host's (Note
// [A card's rehearsal drops the host's convolution temporaries]).
TEST(CardOpsTest, ACardsRecordingHoldsAConvolutionsOutputsAlone) {
  auto x = torch::randn({4, 16, 16, 16}, torch::requires_grad());
  auto w = torch::randn({16, 16, 3, 3}, torch::requires_grad());
  Recorder r;
  r.add_card_kernels();
  auto y = torch::conv2d(x, w, {}, 1, 1);
  EXPECT_EQ(r.live_bytes(), 65536);  // read as the op has returned
  EXPECT_EQ(r.peak_bytes(), 65536);
  y.backward(torch::ones_like(y));
  r.stop();
  EXPECT_EQ(r.peak_bytes(), 3 * 65536 + 9216);
  std::vector<int64_t> allocated;
  for (const Event& e : r.timeline().events()) {
    if (e.kind == EventKind::kAlloc && e.bytes > 0) allocated.push_back(e.bytes);
  }
  EXPECT_EQ(allocated, (std::vector<int64_t>{65536, 65536, 65536, 9216}));
}

// The same convolution for the host: oneDNN's reorders into its blocked
// layouts are real there, taken and freed inside the ops.
TEST(CardOpsTest, AHostsRecordingKeepsItsConvolutionsTemporaries) {
  if (!at::globalContext().userEnabledMkldnn() || !at::hasMKLDNN()) {
    GTEST_SKIP() << "convolutions run without oneDNN here";
  }
  auto x = torch::randn({4, 16, 16, 16}, torch::requires_grad());
  auto w = torch::randn({16, 16, 3, 3}, torch::requires_grad());
  Recorder r;
  auto y = torch::conv2d(x, w, {}, 1, 1);
  y.backward(torch::ones_like(y));
  r.stop();
  int64_t temporaries = 0;
  for (const Event& e : r.timeline().events()) {
    const std::string op = r.timeline().op_name(e.op);
    if (e.kind == EventKind::kAlloc && e.category == Category::kTemporary &&
        op.find("convolution") != std::string::npos) {
      temporaries += e.bytes;
    }
  }
  EXPECT_GT(temporaries, 0);
  EXPECT_GT(r.peak_bytes(), 3 * 65536 + 9216);
}

// One 3x3 convolution, 8 channels in and out, on [batch, 8, 16, 16]: its
// workspaces' bound passes the step's peak.
class OneConvolution final : public TrainableModel {
 public:
  OneConvolution() {
    conv_ = root_.register_module("conv", torch::nn::Conv2d(
        torch::nn::Conv2dOptions(8, 8, 3).bias(false)));
  }
  std::string name() const override { return "one_convolution"; }
  torch::nn::Module& module() override { return root_; }
  at::Tensor forward(const at::Tensor& x) override { return conv_(x).flatten(1); }
  Batch make_batch(int64_t b, const at::TensorOptions& o, uint64_t) const override {
    return {torch::ones({b, 8, 16, 16}, o.dtype(torch::kFloat32)),
            torch::zeros({b, 8 * 14 * 14}, o.dtype(torch::kFloat32))};
  }
  at::Tensor loss(const at::Tensor& out, const at::Tensor& t, bool) const override {
    return (out - t).square().mean();
  }

 private:
  torch::nn::Module root_;
  torch::nn::Conv2d conv_{nullptr};
};

ProfileOptions one_convolution_step(bool cuda_target) {
  ProfileOptions o;
  o.batch = 4;
  o.optimizer = "sgd";
  o.iterations = 2;
  o.cuda_target = cuda_target;
  return o;
}

TEST(CardOpsTest, ACardsProfileSaysWhatCudnnCanAddAtThePeak) {
  OneConvolution model;
  const Profile p = profile_model(model, one_convolution_step(true));
  // The bound from the formula: x 4 x 8 x 16 x 16, dy 4 x 8 x 14 x 14, w 8 x 8 x 9.
  const int64_t bound = 4 * (9 * (4 * 8 * 16 * 16 + 4 * 8 * 14 * 14) / 4 + 4 * 8 * 8 * 9);
  EXPECT_EQ(bound, 139392);
  EXPECT_EQ(bound, cudnn_conv_backward_workspace({4 * 8 * 16 * 16, 4 * 8 * 14 * 14, 8 * 8 * 9}));
  EXPECT_EQ(bound, cudnn_conv_forward_workspace({4 * 8 * 16 * 16, 4 * 8 * 14 * 14, 8 * 8 * 9}));
  // Live at each of the two forwards' and two backwards' marks, plus the
  // bound (the forward's the same: y has dy's elements), over the step's
  // peak (Note [cuDNN's workspace at the step's peak]).
  int64_t live = 0, peak = 0, with = 0;
  int marks = 0;
  for (const Event& e : p.timeline.events()) {
    live += e.kind == EventKind::kAlloc ? e.bytes : -e.bytes;
    peak = std::max(peak, live);
    if (e.kind == EventKind::kAlloc && p.timeline.op_name(e.op) == kCudnnWorkspaceMark) {
      with = std::max(with, live + bound);
      ++marks;
    }
  }
  EXPECT_EQ(marks, 4);
  EXPECT_EQ(peak, p.report.peak_bytes);  // the point is the recorded step's
  ASSERT_GT(with, peak);
  const int64_t said = cudnn_workspace_in_notes(p.report.notes);
  EXPECT_EQ(said, with - peak);
  const auto note = std::find_if(p.report.notes.begin(), p.report.notes.end(),
                                 [](const std::string& n) { return n.find("cuDNN") == 0; });
  ASSERT_NE(note, p.report.notes.end());
  EXPECT_NE(note->find("(" + std::to_string(with - peak) + " B), in backward"),
            std::string::npos)
      << *note;
}

TEST(CardOpsTest, AHostTargetOrAModelWithoutConvolutionsSaysNothingOfCudnn) {
  OneConvolution model;
  const Profile host = profile_model(model, one_convolution_step(false));
  EXPECT_EQ(cudnn_workspace_in_notes(host.report.notes), -1);
  auto mlp = make_model("mlp");
  ProfileOptions o = one_convolution_step(true);
  const Profile card = profile_model(*mlp, o);
  EXPECT_EQ(cudnn_workspace_in_notes(card.report.notes), -1);
  for (const std::string& n : card.report.notes) EXPECT_EQ(n.find("cuDNN"), std::string::npos);
}

}  // namespace
}  // namespace memfit
