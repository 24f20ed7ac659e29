#include "memfit/torch/strategies.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "memfit/core/render/advice_table.h"
#include "memfit/torch/checkpoint.h"
#include "memfit/torch/cpu_autocast.h"
#include "memfit/torch/tracking.h"

namespace memfit {
namespace {

// Small enough for two cores; a long context so that activations (the
// attention matrices) outweigh parameters and Adam's state even at batch 1.
ModelOptions small_gpt() {
  ModelOptions o;
  o.layers = 4;
  o.width = 32;
  o.heads = 2;
  o.context = 128;
  o.vocab = 64;
  return o;
}

std::unique_ptr<TrainableModel> seeded_gpt(uint64_t seed = 0) {
  torch::manual_seed(seed);
  return make_model("gpt", small_gpt());
}

std::vector<at::Tensor> gradients(TrainableModel& m, const Batch& b) {
  for (auto& p : m.module().parameters()) p.mutable_grad() = at::Tensor();
  m.loss(m.forward(b.inputs), b.target).backward();
  std::vector<at::Tensor> g;
  for (auto& p : m.module().parameters()) g.push_back(p.grad().clone());
  for (auto& p : m.module().parameters()) p.mutable_grad() = at::Tensor();
  return g;
}

void expect_close(const std::vector<at::Tensor>& a,
                  const std::vector<at::Tensor>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].defined() && b[i].defined()) << "parameter " << i;
    const double scale = std::max(b[i].norm().item<double>(), 1e-12);
    EXPECT_LT((a[i] - b[i]).norm().item<double>() / scale, tol)
        << "parameter " << i;
  }
}

TEST(CheckpointTest, GradientsEqualThePlainRun) {
  auto m = seeded_gpt();
  const Batch b = m->make_batch(3, at::TensorOptions(), 1);
  const auto plain = gradients(*m, b);
  ASSERT_TRUE(m->set_checkpointing({true, false, true, true}));
  expect_close(gradients(*m, b), plain, 1e-6);
  ASSERT_TRUE(m->set_checkpointing({true, true, true, true}));
  expect_close(gradients(*m, b), plain, 1e-6);
  // Through autograd::grad (the Trainer's path for some parameters only):
  // nothing lands in .grad behind its back.
  auto params = m->module().parameters();
  auto g =
      torch::autograd::grad({m->loss(m->forward(b.inputs), b.target)}, params);
  expect_close(g, plain, 1e-6);
  for (auto& p : params) EXPECT_FALSE(p.grad().defined());
  EXPECT_FALSE(m->set_checkpointing({true}));  // wrong length
  EXPECT_TRUE(m->set_checkpointing({}));
}

TEST(CheckpointTest, KeepsOnlyTheInputAndIsTheFunctionWithoutGrad) {
  auto lin = torch::nn::Linear(8, 8);
  auto x = torch::randn({4, 8}, torch::requires_grad());
  auto fn = [&](const at::Tensor& t) {
    return torch::tanh(lin->forward(t)).sin();
  };
  auto y = checkpoint(fn, x, lin->parameters());
  ASSERT_TRUE(y.requires_grad());
  EXPECT_EQ(y.grad_fn()->name(), "memfit::CheckpointBackward");
  y.sum().backward();
  auto gx = x.grad().clone();
  x.mutable_grad() = at::Tensor();
  for (auto& p : lin->parameters()) p.mutable_grad() = at::Tensor();
  fn(x).sum().backward();
  EXPECT_TRUE(torch::allclose(gx, x.grad()));
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(checkpoint(fn, x, lin->parameters()).requires_grad());
}

TEST(StrategiesTest, ProfilesMeasureEachStrategy) {
  auto m = seeded_gpt();
  ProfileOptions o;
  o.batch = 2;
  const int64_t plain = profile_model(*m, o).report.peak_bytes;
  o.strategies.checkpoint.assign(4, true);
  const int64_t ckpt = profile_model(*m, o).report.peak_bytes;
  EXPECT_LT(ckpt, plain);
  EXPECT_TRUE(m->checkpointing().empty());  // profiling gives the model back
  o.strategies = {};
  o.strategies.zero_grad_set_to_none = false;
  EXPECT_GT(profile_model(*m, o).report.peak_bytes, plain);
  o.strategies = {};
  o.strategies.step = StepStrategies::Step::kEvalNoGrad;
  EXPECT_LT(profile_model(*m, o).report.peak_bytes, plain);
  o.strategies = {};
  o.strategies.autocast_bf16 = true;
  const Profile bf16 = profile_model(*m, o);
  EXPECT_GT(bf16.report.peak_bytes, 0);
  EXPECT_FALSE(cpu_autocast_enabled());
}

std::vector<double> train(TrainableModel& m, int64_t batch, int steps,
                          TrainerOptions o,
                          std::vector<StepReport>* reports = nullptr) {
  auto opt = make_optimizer("adam", m.module().parameters(), 1e-3);
  Trainer t(
      m.module().parameters(), [&] { opt->step(); }, o);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    Batch b =
        m.make_batch(batch, at::TensorOptions(), static_cast<uint64_t>(s));
    StepReport r = t.step(
        b.inputs, b.target, [&](const at::Tensor& x) { return m.forward(x); },
        [&](const at::Tensor& y, const at::Tensor& t) { return m.loss(y, t); });
    losses.push_back(r.loss);
    if (reports) reports->push_back(r);
  }
  return losses;
}

// The definition of done: under a budget where batch 1 does not fit
// plainly, memfit's plan trains 20 steps without OOM and the losses match
// the plain unbudgeted run's.
TEST(StrategiesTest, PlanTrainsWhereOneSampleDoesNotFit) {
  constexpr int64_t kBatch = 4;
  constexpr int kSteps = 20;
  auto probe = seeded_gpt();
  ProfileOptions po;
  po.batch = 1;
  const int64_t plain1 = profile_model(*probe, po).report.peak_bytes;
  po.strategies.checkpoint.assign(4, true);
  const int64_t ckpt1 = profile_model(*probe, po).report.peak_bytes;
  ASSERT_LT(ckpt1, plain1);
  const int64_t budget = ckpt1 + (plain1 - ckpt1) / 2;

  AdviseOptions ao;
  ao.batch = kBatch;
  ao.budget = budget;
  ao.timing_repeats = 1;
  const Advice advice = advise(*probe, ao);
  ASSERT_TRUE(advice.plan.found) << to_text(advice);
  EXPECT_TRUE(advice.plan.exact);
  EXPECT_GT(advice.plan.micro_batch, 0);
  EXPECT_GT(std::count(advice.plan.variant.checkpoint.begin(),
                       advice.plan.variant.checkpoint.end(), true),
            0);
  EXPECT_LE(advice.plan.peak_bytes, budget);
  // The planner recomputes no more than checkpointing every layer.
  double every = -1, optimal = -1;
  for (const auto& p : advice.chain_plans) {
    if (p.rule == "every layer") every = p.recompute_ns;
    if (p.rule == "optimal") optimal = p.recompute_ns;
  }
  ASSERT_GE(every, 0);
  EXPECT_LE(optimal, every);

  auto plain_model = seeded_gpt(7);
  const auto expected = train(*plain_model, kBatch, kSteps, {});

  {  // Plainly, even one sample does not fit.
    SimulatedDevice device(budget);
    auto m = seeded_gpt(7);
    TrainerOptions o;
    o.micro_batch = 1;
    EXPECT_THROW(train(*m, kBatch, 1, o), c10::OutOfMemoryError);
  }
  SimulatedDevice device(budget);
  auto m = seeded_gpt(7);
  std::vector<StepReport> reports;
  const auto losses =
      train(*m, kBatch, kSteps, apply_plan(advice.plan, *m), &reports);
  ASSERT_EQ(losses.size(), expected.size());
  for (size_t s = 0; s < losses.size(); ++s) {
    EXPECT_EQ(reports[s].ooms_recovered, 0) << "step " << s;
    EXPECT_LE(reports[s].peak_bytes, budget) << "step " << s;
    EXPECT_NEAR(losses[s], expected[s], 1e-4 * std::abs(expected[s]))
        << "step " << s;
  }
}

TEST(StrategiesTest, AdviseSaysWhenNothingFits) {
  auto m = seeded_gpt();
  AdviseOptions ao;
  ao.batch = 2;
  ao.budget = 1024;
  ao.timing_repeats = 1;
  const Advice a = advise(*m, ao);
  EXPECT_FALSE(a.plan.found);
  EXPECT_FALSE(a.notes.empty());
  EXPECT_NE(to_text(a).find("does not fit"), std::string::npos);
  EXPECT_NE(to_json(a).find("\"found\": false"), std::string::npos);
  EXPECT_TRUE(m->checkpointing().empty());
}

}  // namespace
}  // namespace memfit
