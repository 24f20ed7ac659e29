#include "memfit/torch/strategies.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <stdexcept>

#include "memfit/core/model/units.h"
#include "memfit/torch/checkpoint.h"
#include "memfit/torch/cpu_autocast.h"

namespace memfit {

namespace {

using Step = StepStrategies::Step;

// Parameter and buffer values (and the model's checkpointing), put back on
// destruction: advising trains the model.
class Restore {
 public:
  explicit Restore(TrainableModel& m)
      : model_(m), checkpointing_(m.checkpointing()) {
    torch::NoGradGuard no_grad;
    for (auto& p : m.module().parameters())
      saved_.emplace_back(p, p.detach().clone());
    for (auto& b : m.module().buffers())
      saved_.emplace_back(b, b.detach().clone());
  }
  ~Restore() {
    torch::NoGradGuard no_grad;
    for (auto& [t, v] : saved_) t.detach().copy_(v);
    for (auto& p : model_.module().parameters())
      p.mutable_grad() = at::Tensor();
    model_.set_checkpointing(checkpointing_);
  }

 private:
  TrainableModel& model_;
  std::vector<bool> checkpointing_;
  std::vector<std::pair<at::Tensor, at::Tensor>> saved_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Runs steps of the model the way the Trainer runs them, for time and memory.
class Bench {
 public:
  Bench(TrainableModel& model, const AdviseOptions& o) : model_(model), o_(o) {}

  Profile profile(const StepStrategies& s, const std::string& optimizer,
                  int64_t batch) {
    ProfileOptions p;
    p.batch = batch;
    p.optimizer = optimizer;
    p.seed = o_.seed;
    p.lr = o_.lr;
    p.strategies = s;
    return profile_model(model_, p);
  }

  // Median milliseconds of a Trainer step on `batch` samples with the
  // strategies, in micro-batches of `micro_batch` (0: whole); the first call
  // runs one untimed step before (the allocator's and the threads' warm-up)
  // unless warm() said steps already ran.
  // Eval steps time forward and loss under their guard.
  double step_ms(const StepStrategies& s, const std::string& optimizer,
                 int64_t batch, int64_t micro_batch = 0) {
    Restore restore(model_);
    auto& module = model_.module();
    if (!model_.set_checkpointing(s.checkpoint)) {
      throw std::invalid_argument(
          "[advise] " + model_.name() + " cannot checkpoint " +
          std::to_string(s.checkpoint.size()) + " blocks");
    }
    Batch b = model_.make_batch(batch, at::TensorOptions(), o_.seed);
    std::vector<double> ms;
    if (s.step != Step::kTrain) {
      module.eval();
      for (int r = warm_ ? 1 : 0; r <= o_.timing_repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        {
          std::optional<torch::NoGradGuard> no_grad;
          std::optional<c10::InferenceMode> inference;
          if (s.step == Step::kEvalNoGrad) no_grad.emplace();
          if (s.step == Step::kEvalInference) inference.emplace();
          std::optional<CpuAutocast> autocast;
          if (s.autocast_bf16) autocast.emplace(true);
          model_.loss(model_.forward(b.inputs), b.target).item<double>();
        }
        if (r > 0) ms.push_back(since(t0));
      }
      module.train();
      warm_ = true;
      return median(ms);
    }
    module.train();
    auto opt = make_optimizer(optimizer, module.parameters(), o_.lr);
    TrainerOptions to;
    to.micro_batch = micro_batch;
    to.autocast_bf16 = s.autocast_bf16;
    to.coupled =
        CoupledLayers::kAllow;  // timed only; advise notes the coupling
    Trainer trainer(
        module.parameters(),
        [&] {
          if (opt) opt->step();
        },
        to, coupled_layers_of(module));
    auto forward = [&](const at::Tensor& x) { return model_.forward(x); };
    auto loss = [&](const at::Tensor& out, const at::Tensor& y) {
      return model_.loss(out, y);
    };
    for (int r = warm_ ? 1 : 0; r <= o_.timing_repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      trainer.step(b.inputs, b.target, forward, loss);
      if (r > 0) ms.push_back(since(t0));
    }
    warm_ = true;
    return median(ms);
  }

 // Steps of the model ran on this device before (recorded): no untimed
  // step is needed.
  void warm() { warm_ = true; }

 private:
  static double since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now() - t0)
        .count();
  }
  TrainableModel& model_;
  const AdviseOptions& o_;
  bool warm_ = false;
};

// The optimizer a variant trains with, by the names make_optimizer knows.
std::string optimizer_of(const StepVariant& v, const std::string& user) {
  std::string name = v.optimizer.empty() ? user : v.optimizer;
  if (v.host_state && find_optimizer(name + kOffloadSuffix)) name += kOffloadSuffix;
  return name;
}

StepStrategies strategies_of(const StepVariant& v) {
  StepStrategies s;
  s.checkpoint = v.checkpoint;
  s.autocast_bf16 = v.autocast_bf16;
  s.zero_grad_set_to_none = !v.zero_grad_in_place;
  s.step = v.step == StepKind::kEvalNoGrad      ? Step::kEvalNoGrad
           : v.step == StepKind::kEvalInference ? Step::kEvalInference
                                                : Step::kTrain;
  return s;
}

}  // namespace

Advice advise(TrainableModel& model, const AdviseOptions& o, const Progress& progress) {
  if (o.budget < 0 && o.cards.empty()) {
    throw std::invalid_argument("[advise] the budget must be >= 0 bytes, got " +
                                std::to_string(o.budget));
  }
  if (!find_optimizer(o.optimizer)) {
    make_optimizer(o.optimizer, {}, o.lr);  // its message names the choices
  }
  Restore restore(model);
  model.set_checkpointing({});
  Bench bench(model, o);

  AdviseSettings s;
  s.batch = o.batch;
  s.budget = o.budget;
  if (o.batch >= 1) {
    Batch b = model.make_batch(o.batch, at::TensorOptions(), o.seed);
    s.reserve_bytes = static_cast<int64_t>(b.inputs.nbytes() + b.target.nbytes());
  }
  s.optimizer = o.optimizer;
  s.has_optimizer = o.optimizer != "none";
  OptimizerChoices choices = optimizer_choices(o.optimizer);
  // This front offloads the optimizers with a built-in "<name>-offload".
  s.can_offload = choices.can_offload && find_optimizer(o.optimizer + kOffloadSuffix);
  s.offload_label = o.optimizer + kOffloadSuffix;
  s.other_optimizers = std::move(choices.others);
  s.lighter = std::move(choices.lighter);
  s.chain = model.chain();
  s.allow_approximate = o.allow_approximate;
  s.split_changes = mixing_layers_phrase(coupled_layers_of(model.module()));
  s.progress = progress;
  s.cards = o.cards;
  s.predict_rows = o.predict_rows;

  AdviseMeasurer m;
  m.record = [&](const StepVariant& v, int64_t batch, bool cheap) {
    ProfileOptions p;
    p.batch = batch;
    p.optimizer = optimizer_of(v, o.optimizer);
    p.seed = o.seed;
    p.lr = o.lr;
    p.strategies = strategies_of(v);
    // Autocast does nothing on meta: a bf16 step is recorded on the CPU.
    p.mode = cheap && o.meta && !v.autocast_bf16 ? "meta" : "cpu";
    p.cuda_target = o.cuda_target;
    p.cuda_workspace = o.cuda_workspace;
    Profile prof = profile_model(model, p);
    return VariantRecording{prof.report, std::move(prof.timeline), prof.report.mode == "meta"};
  };
  if (o.timing_repeats > 0) {
    m.time_ratio = [&](const StepVariant& v, int64_t micro_batch) {
      // The planner recorded the plain step on the CPU first, and the plan
      // since: no untimed step before. The plan is timed first, so what
      // warm-up is left counts against it, not for it.
      bench.warm();
      const double ms = bench.step_ms(strategies_of(v), optimizer_of(v, o.optimizer), o.batch,
                                      micro_batch);
      const double plain = bench.step_ms(StepStrategies{}, o.optimizer, o.batch);
      return plain > 0 ? ms / plain : 0.0;
    };
  }
  Advice a = plan_advice(m, s);
  a.model = model.name();
  a.parameter_bytes = 0;
  for (const auto& p : model.module().parameters()) a.parameter_bytes += p.nbytes();
  for (const auto& b : model.module().buffers()) a.parameter_bytes += b.nbytes();
  if (!s.chain.empty()) {
    a.chain_description = "the model's chain (" + std::to_string(s.chain.size()) + " blocks)";
  }
  return a;
}

TrainerOptions apply_plan(const AdvisePlan& plan, TrainableModel& model,
                          TrainerOptions base) {
  if (!model.set_checkpointing(plan.variant.checkpoint)) {
    throw std::invalid_argument(
        "[apply_plan] " + model.name() + " cannot checkpoint " +
        std::to_string(plan.variant.checkpoint.size()) +
        " blocks: its chain has " + std::to_string(model.chain().size()));
  }
  base.micro_batch = plan.micro_batch;
  base.autocast_bf16 = plan.variant.autocast_bf16;
  return base;
}

}  // namespace memfit
