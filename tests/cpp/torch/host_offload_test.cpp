#include "memfit/torch/host_offload.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "memfit/core/render/advice_table.h"
#include "memfit/torch/models.h"
#include "memfit/torch/profile.h"
#include "memfit/torch/strategies.h"
#include "memfit/torch/tracking.h"
#include "memfit/torch/trainer.h"

namespace memfit {
namespace {

torch::nn::Sequential seeded_net() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::Tanh(),
                               torch::nn::Linear(32, 4));
}

void backward_on(torch::nn::Sequential& net, int step) {
  torch::manual_seed(100 + step);
  const auto x = torch::randn({6, 8});
  const auto y = torch::randn({6, 4});
  torch::mse_loss(net->forward(x), y).backward();
}

int64_t parameter_bytes(torch::nn::Module& m) {
  int64_t b = 0;
  for (const auto& p : m.parameters()) b += static_cast<int64_t>(p.nbytes());
  return b;
}

// Counts tracked allocations on the CPU while installed.
struct AllocationCounter : AllocationObserver {
  int64_t allocations = 0;
  AllocationCounter() { tracking::add_observer(this); }
  ~AllocationCounter() override { tracking::remove_observer(this); }
  void on_alloc(const Allocation& a) override {
    if (a.device == Device::kCPU) ++allocations;
  }
  void on_free(const Allocation&, bool) override {}
};

// On the CPU the host step is the same arithmetic as Adam's own: the
// parameters after several steps are equal bit for bit, a frozen parameter
// (no gradient) and weights changed on the device between steps included.
TEST(HostOffloadTest, EqualsAdamBitForBit) {
  auto plain_net = seeded_net();
  auto offload_net = seeded_net();
  for (auto* net : {&plain_net, &offload_net}) {
    (*net)[2]->named_parameters()["bias"].set_requires_grad(false);
  }
  torch::optim::Adam plain(plain_net->parameters(), torch::optim::AdamOptions(1e-2));
  auto offload = host_offload_adam(offload_net->parameters(), 1e-2);
  for (int step = 0; step < 5; ++step) {
    if (step == 3) {  // weights changed on the device between steps
      torch::NoGradGuard no_grad;
      for (auto* net : {&plain_net, &offload_net}) {
        for (auto& p : (*net)->parameters()) p.mul_(0.5);
      }
    }
    backward_on(plain_net, step);
    backward_on(offload_net, step);
    plain.step();
    offload->step();
    plain.zero_grad();
    offload->zero_grad();
  }
  const auto a = plain_net->parameters(), b = offload_net->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
  }
  EXPECT_TRUE(torch::equal(b.back(), seeded_net()->parameters().back() * 0.5))
      << "the frozen bias moved";
}

// Under tracking (the CPU playing the device), the offloaded step allocates
// nothing: the state, the gradient copies and Adam's temporaries are the
// host's. Plain Adam's step allocates its state on the device.
TEST(HostOffloadTest, StepAllocatesNothingOnTheDevice) {
  TrackingScope tracking;
  auto net = seeded_net();
  const int64_t params = parameter_bytes(*net);
  auto offload = host_offload_adam(net->parameters(), 1e-3);
  backward_on(net, 0);
  const int64_t live_before = tracking::live_bytes(Device::kCPU);
  {
    AllocationCounter counter;
    offload->step();
    EXPECT_EQ(counter.allocations, 0);
  }
  EXPECT_EQ(tracking::live_bytes(Device::kCPU), live_before);
  // Host: parameter copies, gradient buffers, exp_avg and exp_avg_sq.
  EXPECT_EQ(offload->host_bytes(), 4 * params);

  torch::optim::Adam plain(net->parameters(), torch::optim::AdamOptions(1e-3));
  AllocationCounter counter;
  plain.step();
  EXPECT_GT(counter.allocations, 0);
  EXPECT_GE(tracking::live_bytes(Device::kCPU), live_before + 2 * params);
}

// An LR scheduler changes the outer optimizer's options; the host step uses
// them.
TEST(HostOffloadTest, LearningRateChangesReachTheHostStep) {
  auto net = seeded_net();
  auto offload = host_offload_adam(net->parameters(), 1e-2);
  offload->param_groups().front().options().set_lr(0.0);
  std::vector<at::Tensor> before;
  for (const auto& p : net->parameters()) before.push_back(p.detach().clone());
  backward_on(net, 0);
  offload->step();
  const auto after = net->parameters();
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_TRUE(torch::equal(after[i], before[i])) << "parameter " << i;
  }
  EXPECT_EQ(offload->inner().param_groups().front().options().get_lr(), 0.0);
}

// The "Adam's state kept on the CPU": profiled by name, the state
// leaves the device's figures, and a budget that plain Adam overflows is
// enough.
TEST(HostOffloadTest, ProfileAndBudget) {
  auto m = make_model("mlp");
  ProfileOptions o;
  o.batch = 4;
  const Profile adam = profile_model(*m, o);
  o.optimizer = "adam-offload";
  const Profile offload = profile_model(*m, o);
  const int64_t params = adam.report.parameter_bytes;
  const auto state = static_cast<size_t>(Category::kOptimizerState);
  EXPECT_GT(adam.report.categories_at_peak[state], 0);
  EXPECT_EQ(offload.report.categories_at_peak[state], 0);
  EXPECT_LE(offload.report.peak_bytes, adam.report.peak_bytes - 2 * params);
  for (const auto& ph : offload.report.phases) {
    if (ph.name != kPhaseOptimizerStep) continue;
    EXPECT_EQ(ph.delta_bytes, 0) << ph.note;
    EXPECT_NE(ph.note.find("on the host"), std::string::npos) << ph.note;
  }
  ASSERT_FALSE(offload.report.notes.empty());
  EXPECT_NE(offload.report.notes.back().find("on the host"), std::string::npos);

  // Training for real on a simulated device between the two peaks: Adam
  // runs out of memory in its step, the offloaded Adam trains.
  const int64_t budget = (offload.report.peak_bytes + adam.report.peak_bytes) / 2;
  for (const std::string name : {"adam", "adam-offload"}) {
    SimulatedDevice device(budget);
    auto net = make_model("mlp");
    auto opt = make_optimizer(name, net->module().parameters(), 1e-3);
    TrainerOptions to;
    to.split = false;
    Trainer trainer(net->module().parameters(), [&] { opt->step(); }, to);
    auto train = [&] {
      for (uint64_t s = 0; s < 3; ++s) {
        const Batch b = net->make_batch(4, at::TensorOptions(), s);
        trainer.step(
            b.inputs, b.target, [&](const at::Tensor& x) { return net->forward(x); },
            [&](const at::Tensor& y, const at::Tensor& t) { return net->loss(y, t); });
      }
    };
    if (name == "adam") {
      EXPECT_THROW(train(), c10::OutOfMemoryError);
    } else {
      EXPECT_NO_THROW(train());
    }
  }
}

// Where the state is what does not fit, advise plans it on the host; only
// then (the copies and the CPU step cost far more beside a GPU).
TEST(HostOffloadTest, AdvisePlansTheHostStateWhenNothingElseFits) {
  auto m = make_model("mlp");
  ProfileOptions o;
  o.batch = 2;
  o.optimizer = "adam-offload";
  const int64_t offload_peak = profile_model(*m, o).report.peak_bytes;
  o.optimizer = "adam";
  o.batch = 1;
  const int64_t adam_one = profile_model(*m, o).report.peak_bytes;
  ASSERT_LT(offload_peak, adam_one);  // the state outweighs the activations

  AdviseOptions ao;
  ao.batch = 2;
  ao.timing_repeats = 1;
  const Batch b = m->make_batch(2, at::TensorOptions(), 0);
  ao.budget = offload_peak + static_cast<int64_t>(b.inputs.nbytes() + b.target.nbytes());
  const Advice a = advise(*m, ao);
  ASSERT_TRUE(a.plan.found) << to_text(a);
  EXPECT_EQ(a.plan.optimizer, "adam-offload");
  EXPECT_TRUE(a.plan.exact);
  EXPECT_EQ(a.plan.micro_batch, 0);
  EXPECT_EQ(a.plan.peak_bytes, offload_peak);
  bool row = false;
  for (const auto& r : a.rows) row |= r.variant.host_state && r.variant.exact() && r.fits;
  EXPECT_TRUE(row) << to_text(a);

  // With room for plain Adam, the plan stays on the device.
  o.batch = 2;
  ao.budget = profile_model(*m, o).report.peak_bytes + ao.budget - offload_peak;
  EXPECT_EQ(advise(*m, ao).plan.optimizer, "adam");
}

TEST(HostOffloadTest, UnknownOptimizerNamesTheChoices) {
  try {
    make_optimizer("adamw", {}, 1e-3);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("adam-offload"), std::string::npos);
  }
}

}  // namespace
}  // namespace memfit
