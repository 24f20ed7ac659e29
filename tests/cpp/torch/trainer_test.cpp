#include "memfit/torch/trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "memfit/torch/models.h"
#include "memfit/torch/tracking.h"

namespace memfit {
namespace {

constexpr int64_t kBatch = 21;

struct SmallClassifier {
  torch::nn::Sequential model{torch::nn::Linear(8, 16), torch::nn::Tanh(),
                              torch::nn::Linear(16, 3)};
  at::Tensor x, y;
  bool mean = true;
  SmallClassifier() {
    torch::manual_seed(0);
    model = torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                                  torch::nn::Linear(16, 3));
    x = torch::randn({kBatch, 8});
    y = torch::randint(0, 3, {kBatch});
  }
  at::Tensor loss(const at::Tensor& out, const at::Tensor& t) const {
    namespace F = torch::nn::functional;
    auto o = F::CrossEntropyFuncOptions();
    if (mean) o.reduction(torch::kMean); else o.reduction(torch::kSum);
    return F::cross_entropy(out, t, o);
  }
  std::vector<at::Tensor> full_batch_gradients() {
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    loss(model->forward(x), y).backward();
    std::vector<at::Tensor> g;
    for (auto& p : model->parameters()) g.push_back(p.grad().clone());
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    return g;
  }
  // A trainer whose "optimizer step" keeps the accumulated gradients.
  Trainer trainer(TrainerOptions o, std::vector<at::Tensor>* captured) {
    o.mean_loss = mean;
    return Trainer(model->parameters(), [this, captured] {
      captured->clear();
      for (auto& p : model->parameters()) captured->push_back(p.grad());
    }, o);
  }
  StepReport step(Trainer& t) {
    return t.step(x, y, [this](const at::Tensor& in) { return model->forward(in); },
                  [this](const at::Tensor& o, const at::Tensor& t) { return loss(o, t); });
  }
};

void expect_close(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].defined());
    const double rel = ((a[i] - b[i]).norm() / b[i].norm()).item<double>();
    EXPECT_LT(rel, 1e-5) << "parameter " << i;
  }
}

class SplitGradients
    : public ::testing::TestWithParam<std::tuple<bool, int64_t>> {};

TEST_P(SplitGradients, EqualTheFullBatchGradients) {
  auto [mean, chunks] = GetParam();
  SmallClassifier s;
  s.mean = mean;
  const auto reference = s.full_batch_gradients();
  TrainerOptions o;
  o.micro_batch = (kBatch + chunks - 1) / chunks;
  std::vector<at::Tensor> got;
  Trainer t = s.trainer(o, &got);
  StepReport r = s.step(t);
  EXPECT_EQ(r.micro_batches, chunks);
  EXPECT_EQ(r.samples, kBatch);
  expect_close(got, reference);
  // The parameters' gradients are gone after the step (set_to_none).
  for (auto& p : s.model->parameters()) EXPECT_FALSE(p.grad().defined());
}

INSTANTIATE_TEST_SUITE_P(MeanAndSum, SplitGradients,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(1, 2, 3, 7)));

TEST(TrainerTest, AnOomForcedAtAnyAllocationIsRecoveredWithExactGradients) {
  SmallClassifier s;
  const auto reference = s.full_batch_gradients();
  // How many tracked allocations one step's micro-batches make.
  TrackingScope scope;
  TrainerOptions o;
  o.micro_batch = 7;
  std::vector<at::Tensor> got;
  const int64_t before = tracking::allocation_count(Device::kCPU);
  {
    Trainer t = s.trainer(o, &got);
    s.step(t);
  }
  const int64_t per_step = tracking::allocation_count(Device::kCPU) - before;
  ASSERT_GT(per_step, 30);
  for (int64_t k = 1; k <= per_step; ++k) {
    Trainer t = s.trainer(o, &got);
    tracking::fail_allocation_after(Device::kCPU, k);
    StepReport r = s.step(t);
    tracking::fail_allocation_after(Device::kCPU, 0);
    EXPECT_EQ(r.ooms_recovered, 1) << "k=" << k;
    EXPECT_EQ(r.samples, kBatch) << "k=" << k;
    int64_t total = 0;
    for (auto c : r.chunks) total += c;
    EXPECT_EQ(total, kBatch) << "k=" << k;
    expect_close(got, reference);
  }
}

TEST(TrainerTest, BudgetSplitsTheBatchAndTheNextStepStartsFromWhatWorked) {
  TrackingScope scope;
  auto model = make_model("mlp");
  torch::optim::SGD sgd(model->module().parameters(), 0.01);
  TrainerOptions o;
  o.budget = 12 << 20;  // the whole batch of 1024 needs more
  Trainer t(model->module().parameters(), [&] { sgd.step(); }, o);
  Batch b = model->make_batch(1024, at::TensorOptions(), 0);
  auto fwd = [&](const at::Tensor& x) { return model->forward(x); };
  auto loss = [&](const at::Tensor& out, const at::Tensor& y) {
    return model->loss(out, y);
  };
  StepReport first = t.step(b.inputs, b.target, fwd, loss);
  EXPECT_GT(first.ooms_recovered, 0);
  EXPECT_EQ(first.samples, 1024);
  EXPECT_LE(first.peak_bytes, 12 << 20);
  StepReport second = t.step(b.inputs, b.target, fwd, loss);
  EXPECT_EQ(second.ooms_recovered, 0);
  EXPECT_EQ(second.micro_batch, t.micro_batch());
}

// What a distributed run does once the ranks agree: the next step starts
// from the given size, and the gradients still equal the full batch's.
TEST(TrainerTest, SetMicroBatchStartsTheNextStepThere) {
  SmallClassifier c;
  const auto full = c.full_batch_gradients();
  std::vector<at::Tensor> got;
  Trainer t = c.trainer(TrainerOptions{}, &got);
  t.set_micro_batch(5);
  EXPECT_EQ(t.micro_batch(), 5);
  const StepReport r = c.step(t);
  EXPECT_EQ(r.micro_batches, 5);  // 21 = 5 + 4 + 4 + 4 + 4 (balanced)
  EXPECT_EQ(r.samples, kBatch);
  expect_close(got, full);
  EXPECT_THROW(t.set_micro_batch(-1), c10::Error);
}

TEST(TrainerTest, TwoHundredStepsUnderAChangingBudgetCountEverySampleOnce) {
  TrackingScope scope;
  torch::manual_seed(0);
  auto model = make_model("mlp");  // made under tracking: its bytes count
  torch::optim::Adam adam(model->module().parameters());
  Trainer t(model->module().parameters(), [&] { adam.step(); }, TrainerOptions{});
  auto fwd = [&](const at::Tensor& x) { return model->forward(x); };
  auto loss = [&](const at::Tensor& out, const at::Tensor& y) {
    return model->loss(out, y);
  };
  std::vector<int64_t> live_between;
  int64_t samples = 0;
  for (int step = 0; step < 200; ++step) {
    // 16 to 40 MiB: from 4 micro-batches to the whole batch.
    t.set_budget((16 << 20) + (step * 7919 % 25) * (1 << 20));
    StepReport r;
    {
      Batch b = model->make_batch(64, at::TensorOptions(), step);
      r = t.step(b.inputs, b.target, fwd, loss);
    }
    EXPECT_EQ(r.samples, 64);
    samples += r.samples;
    live_between.push_back(tracking::live_bytes(Device::kCPU));
  }
  EXPECT_EQ(samples, 200 * 64);
  // After the first step (Adam's state appears), nothing grows.
  for (size_t i = 2; i < live_between.size(); ++i) {
    EXPECT_EQ(live_between[i], live_between[1]) << "step " << i;
  }
}

TEST(TrainerTest, NoSplitLetsTheOomOut) {
  SmallClassifier s;
  TrainerOptions o;
  o.split = false;
  o.budget = 1024;
  std::vector<at::Tensor> got;
  Trainer t = s.trainer(o, &got);
  EXPECT_THROW(s.step(t), c10::OutOfMemoryError);
}

TEST(TrainerTest, OneSampleThatDoesNotFitIsAClearOom) {
  SmallClassifier s;
  TrainerOptions o;
  o.budget = 64;
  std::vector<at::Tensor> got;
  Trainer t = s.trainer(o, &got);
  try {
    s.step(t);
    FAIL();
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("even one sample"),
              std::string::npos);
  }
}

// The OOM names what fills the memory and advises for that cause: here the
// batch's own data (made under the budget, as a batch moved to the device).
TEST(TrainerTest, WhenTheBatchItselfFillsTheMemoryTheOomSaysSo) {
  auto model = make_model("mlp");
  TrainerOptions o;
  Trainer t(model->module().parameters(), [] {}, o);
  SimulatedDevice device(16 << 20);
  Batch b = model->make_batch(4096, at::TensorOptions(), 0);  // 12.28 MiB of inputs
  try {
    t.step(b.inputs, b.target, [&](const at::Tensor& x) { return model->forward(x); },
           [&](const at::Tensor& out, const at::Tensor& y) { return model->loss(out, y); });
    FAIL() << "expected an out-of-memory error";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_EQ(msg.rfind("CUDA out of memory. [Trainer::step] even one sample does not fit in "
                        "the budget of 16.00 MiB: it ran out in the ",
                        0),
              0u)
        << msg;
    EXPECT_NE(msg.find("with the batch 12.28 MiB, parameters 2.55 MiB"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("The batch's own inputs and targets are the excess: keep the batch on "
                       "the host"),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.find("Use a smaller batch"), std::string::npos) << msg;
  }
}

// The same batch kept on the host (HostMemory: RAM beside the device), each
// micro-batch copied to the device as it runs: the step fits.
TEST(TrainerTest, ABatchOnTheHostIsMovedOneMicroBatchAtATimeAndFits) {
  auto model = make_model("mlp");
  TrainerOptions o;
  Trainer t(model->module().parameters(), [] {}, o);
  SimulatedDevice device(16 << 20);
  std::optional<Batch> b;
  {
    HostMemory host;
    b = model->make_batch(4096, at::TensorOptions(), 0);
  }
  const StepReport r = t.step(
      b->inputs, b->target, [&](const at::Tensor& x) { return model->forward(x.clone()); },
      [&](const at::Tensor& out, const at::Tensor& y) { return model->loss(out, y.clone()); });
  EXPECT_EQ(r.samples, 4096);
  EXPECT_GT(r.micro_batches, 1);
  EXPECT_LE(r.peak_bytes, 16 << 20);
}

// An error that is not an OOM (the user's forward raising on the second
// micro-batch) leaves no half-accumulated gradients behind.
TEST(TrainerTest, AnyErrorMidStepLeavesNoPartialGradients) {
  SmallClassifier s;
  TrainerOptions o;
  o.micro_batch = 7;
  std::vector<at::Tensor> got;
  Trainer t = s.trainer(o, &got);
  int calls = 0;
  EXPECT_THROW(
      t.step(s.x, s.y,
             [&](const at::Tensor& in) {
               if (++calls == 2) throw std::runtime_error("the user's forward failed");
               return s.model->forward(in);
             },
             [&](const at::Tensor& out, const at::Tensor& y) { return s.loss(out, y); }),
      std::runtime_error);
  EXPECT_EQ(calls, 2);
  for (const auto& p : s.model->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(TrainerTest, BatchNormRefusesToBeSplitByDefaultAndNamesTheLayer) {
  TrackingScope scope;
  auto model = make_model("cnn");
  const auto coupled = coupled_layers_of(model->module());
  ASSERT_FALSE(coupled.empty());
  TrainerOptions o;
  o.micro_batch = 2;
  Trainer t(model->module().parameters(), [] {}, o, coupled);
  Batch b = model->make_batch(4, at::TensorOptions(), 0);
  auto fwd = [&](const at::Tensor& x) { return model->forward(x); };
  auto loss = [&](const at::Tensor& out, const at::Tensor& y) {
    return model->loss(out, y);
  };
  try {
    t.step(b.inputs, b.target, fwd, loss);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("bn"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("coupled=allow"), std::string::npos);
  }
  o.coupled = CoupledLayers::kAllow;
  Trainer allowed(model->module().parameters(), [] {}, o, coupled);
  EXPECT_EQ(allowed.step(b.inputs, b.target, fwd, loss).micro_batches, 2);
}

TEST(TrainerTest, BadInputIsExplained) {
  SmallClassifier s;
  std::vector<at::Tensor> got;
  Trainer t = s.trainer({}, &got);
  auto fwd = [&](const at::Tensor& x) { return s.model->forward(x); };
  auto loss = [&](const at::Tensor& o, const at::Tensor& y) { return s.loss(o, y); };
  EXPECT_THROW(t.step(s.x.narrow(0, 0, 0), s.y.narrow(0, 0, 0), fwd, loss),
               std::invalid_argument);
  EXPECT_THROW(t.step(s.x, s.y.narrow(0, 0, 5), fwd, loss), c10::Error);
  EXPECT_THROW(t.step(s.x, s.y, fwd, loss, 2), c10::Error);
  EXPECT_THROW(t.step(s.x, s.y, fwd,
                      [](const at::Tensor& o, const at::Tensor&) { return o; }),
               std::invalid_argument);
}

}  // namespace
}  // namespace memfit
