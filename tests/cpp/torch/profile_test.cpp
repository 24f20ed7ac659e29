#include "memfit/torch/profile.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>

#include "memfit/torch/models.h"
#include "memfit/torch/tracking.h"

namespace memfit {
namespace {

int64_t category(const Report& r, Category c) {
  return r.categories_at_peak[static_cast<int>(c)];
}

const PhaseRow& phase(const Report& r, const std::string& name, int iteration) {
  for (const auto& p : r.phases) {
    if (p.name == name && p.iteration == iteration) return p;
  }
  throw std::runtime_error("no phase " + name);
}

TEST(ProfileTest, MlpWithAdamAtBatch64HasExactParameterGradientAndStateBytes) {
  torch::manual_seed(0);
  auto model = make_model("mlp");
  ProfileOptions o;
  o.batch = 64;
  o.optimizer = "adam";
  Profile p = profile_model(*model, o);
  const int64_t params = 4 * 669'706;
  EXPECT_EQ(p.report.parameter_bytes, params);
  EXPECT_EQ(category(p.report, Category::kParameter), params);
  EXPECT_EQ(category(p.report, Category::kGradient), params);
  EXPECT_EQ(category(p.report, Category::kOptimizerState), 2 * params);
  EXPECT_EQ(phase(p.report, "optimizer_step", 1).delta_bytes, 2 * params);
  EXPECT_EQ(phase(p.report, "optimizer_step", 2).delta_bytes, 0);
  EXPECT_EQ(phase(p.report, "zero_grad", 2).delta_bytes, -params);
  int64_t sum = 0;
  for (auto b : p.report.categories_at_peak) sum += b;
  EXPECT_EQ(sum, p.report.peak_bytes);
  // Inputs: 64 x 28 x 28 floats and 64 int64 labels.
  EXPECT_EQ(phase(p.report, "inputs", 1).delta_bytes, 64 * 784 * 4 + 64 * 8);
}

TEST(ProfileTest, MomentumStateIsOneTimesParametersAndSgdHasNone) {
  auto model = make_model("mlp");
  ProfileOptions o;
  o.batch = 8;
  o.optimizer = "momentum";
  const int64_t params = 4 * 669'706;
  EXPECT_EQ(phase(profile_model(*model, o).report, "optimizer_step", 1).delta_bytes,
            params);
  o.optimizer = "sgd";
  EXPECT_EQ(phase(profile_model(*model, o).report, "optimizer_step", 1).delta_bytes, 0);
}

TEST(ProfileTest, ProfilingLeavesTheModelAsItWas) {
  torch::manual_seed(0);
  auto model = make_model("mlp");
  std::vector<at::Tensor> before;
  for (auto& p : model->module().parameters()) before.push_back(p.detach().clone());
  ProfileOptions o;
  o.batch = 4;
  profile_model(*model, o);
  o.mode = "meta";
  profile_model(*model, o);
  auto after = model->module().parameters();
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(after[i].device().is_cpu());
    EXPECT_TRUE(torch::equal(before[i], after[i]));
    EXPECT_FALSE(after[i].grad().defined());
  }
}

// A step that does not fit a simulated device throws its OOM, and the model
// comes back as it was: putting it back must not allocate (a second OOM
// while the first unwinds would end the process).
TEST(ProfileTest, AStepThatDoesNotFitThrowsAndGivesTheModelBack) {
  torch::manual_seed(0);
  auto model = make_model("mlp");
  std::vector<at::Tensor> before;
  int64_t params = 0;
  for (auto& p : model->module().parameters()) {
    before.push_back(p.detach().clone());
    params += static_cast<int64_t>(p.nbytes());
  }
  ProfileOptions o;
  o.batch = 4;
  {
    // Room for memfit's snapshot and the step's parameters, not for a
    // third copy of them.
    SimulatedDevice device(params * 5 / 2);
    EXPECT_THROW(profile_model(*model, o), c10::OutOfMemoryError);
  }
  auto after = model->module().parameters();
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(torch::equal(before[i], after[i]));
  }
}

// Small gpt and lstm configurations: seconds on two cores.
ModelOptions small_options(int64_t context, int64_t steps) {
  ModelOptions mo;
  mo.layers = 2;
  mo.width = 64;
  mo.context = context;
  mo.vocab = 8 * context;
  mo.lstm_steps = steps;
  mo.lstm_hidden = 4 * steps;
  return mo;
}

// A model whose forward runs an op torch gives a meta kernel only from its
// Python package (histc), and memfit does not fill (Note [Native meta
// kernels]): in this C++-only process meta mode falls back, names the op,
// and says how to get meta.
class Histogram final : public TrainableModel {
 public:
  Histogram() { fc_ = root_.register_module("fc", torch::nn::Linear(4, 4)); }
  std::string name() const override { return "histogram"; }
  torch::nn::Module& module() override { return root_; }
  at::Tensor forward(const at::Tensor& x) override {
    return fc_->forward(x) + at::histc(x, 4).sum();
  }
  Batch make_batch(int64_t batch, const at::TensorOptions& o, uint64_t) const override {
    return {torch::ones({batch, 4}, o), torch::ones({batch, 4}, o)};
  }
  at::Tensor loss(const at::Tensor& out, const at::Tensor& target, bool) const override {
    return (out - target).pow(2).mean();
  }

 private:
  torch::nn::Module root_;
  torch::nn::Linear fc_{nullptr};
};

TEST(ProfileTest, MetaFallsBackToCpuForAnOpWithoutAMetaKernelAndSaysSo) {
  Histogram model;
  ProfileOptions o;
  o.batch = 2;
  o.mode = "meta";
  Profile p = profile_model(model, o);
  EXPECT_EQ(p.report.mode, "cpu");
  ASSERT_EQ(p.report.notes.size(), 1u);
  const std::string& note = p.report.notes[0];
  EXPECT_NE(note.find("meta mode unavailable for histogram (no meta kernel for aten::histc"),
            std::string::npos) << note;
  EXPECT_NE(note.find("python -m memfit"), std::string::npos) << note;
  EXPECT_NE(note.find("fell back to cpu"), std::string::npos) << note;
  EXPECT_GT(p.report.peak_bytes, 0);
}

class PredictionTest : public ::testing::TestWithParam<std::string> {};

// See Note [Predicting the peak at any batch]: probes at 4, 8 and 16 predict
// the peak at 256 within 2% (the README's benchmark runs full-size models).
TEST_P(PredictionTest, PeakAt256FromSmallProbesIsWithinTwoPercent) {
  auto model = make_model(GetParam(), small_options(32, 16));
  ProfileOptions o;
  PeakModel pm = probe_peak_model(*model, o, {4, 8, 16});
  o.batch = 256;
  const int64_t measured = profile_model(*model, o).report.peak_bytes;
  const int64_t predicted = pm.predict(256);
  EXPECT_NEAR(static_cast<double>(predicted) / measured, 1.0, 0.02)
      << "predicted " << predicted << " measured " << measured;
  EXPECT_LT(pm.max_rel_residual(), 0.02);
}

INSTANTIATE_TEST_SUITE_P(BuiltinModels, PredictionTest,
                         ::testing::Values("mlp", "cnn", "gpt", "lstm"));

TEST(ProfileTest, BadInputIsRejectedWithAClearMessage) {
  auto model = make_model("mlp");
  ProfileOptions o;
  o.batch = 0;
  try {
    profile_model(*model, o);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("batch must be >= 1"), std::string::npos);
  }
  o.batch = 2;
  o.optimizer = "adagrad";
  EXPECT_THROW(profile_model(*model, o), std::invalid_argument);
  try {
    make_model("resnet");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("mlp, cnn, gpt, lstm"), std::string::npos);
  }
}

}  // namespace
}  // namespace memfit
