#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <iostream>
#include <memory>
#include <optional>

#include "args.h"
#include "commands.h"
#include "memfit/core/model/units.h"
#include "memfit/core/render/json_writer.h"
#include "memfit/torch/fit.h"
#include "memfit/torch/models.h"
#include "memfit/torch/profile.h"
#include "memfit/torch/strategies.h"
#include "memfit/torch/tracking.h"
#include "memfit/torch/trainer.h"

namespace memfit::cli {
namespace {

// What one `memfit train` trains: its flags, read once.
struct TrainRun {
  std::string name;
  int64_t batch = 0;
  int64_t steps = 0;
  int64_t budget = 0;
  std::string optimizer;  // --optimizer; a plan may train another
  bool json = false;
  Progress progress;
};

TrainRun read_run(const Args& args) {
  TrainRun run;
  run.name = args.require("model");
  run.batch = args.get_count("batch", 64);
  run.steps = args.get_count("steps", 3);
  run.budget = args.get_size("budget", 1);
  run.optimizer = args.choice("optimizer", "adam", optimizer_names());
  run.json = args.has("json");
  run.progress = progress_of(args);
  return run;
}

// The default CPU generator's state, put back when this goes out of scope.
// Measuring on a probe model must not move the weights the run starts from
// (the probe's initialisation draws from the default generator): the same
// command with and without --plan or the micro-batch fit trains the same
// model.
class KeptGenerator {
 public:
  KeptGenerator()
      : generator_(at::detail::getDefaultCPUGenerator()),
        state_(generator_.get_state()) {}
  ~KeptGenerator() { generator_.set_state(state_); }
  KeptGenerator(const KeptGenerator&) = delete;
  KeptGenerator& operator=(const KeptGenerator&) = delete;

 private:
  at::Generator generator_;
  at::Tensor state_;
};

// --plan auto: the plan memfit advise chooses for this batch and budget,
// measured on a model of the same shape before the budget is in force.
std::optional<AdvisePlan> plan_of(const Args& args, const TrainRun& run) {
  if (args.choice("plan", "none", {"none", "auto"}) != "auto") return std::nullopt;
  AdviseOptions ao;
  ao.batch = run.batch;
  ao.budget = run.budget;
  ao.optimizer = run.optimizer;
  ao.allow_approximate = args.has("allow-approximate");
  ao.timing_repeats = 0;  // the plan is what trains; its time is only said, estimated
  std::optional<AdvisePlan> plan;
  {
    const KeptGenerator kept;
    auto probe = make_model(run.name, model_options(args));
    run.progress.step("plan: measure the strategies for batch " + std::to_string(run.batch) +
                      " under " + format_bytes(run.budget));
    plan = advise(*probe, ao).plan;
  }
  if (!run.json) {
    std::cout << "plan: " << plan->summary
              << (plan->found ? "" : " (nothing measured fits the budget)") << "\n";
  }
  return plan;
}

// The first micro-batch: the fit's verified answer (Note [Verifying the
// answer]), not found by running out of memory; OOM recovery stays the
// safety net. Measured on a model of the same shape.
void fit_micro_batch(const Args& args, const TrainRun& run, TrainerOptions& o) {
  const KeptGenerator kept;
  auto probe = make_model(run.name, model_options(args));
  FitOptions fo;
  fo.budget = run.budget;
  fo.optimizer = run.optimizer;
  // From the second micro-batch on, the accumulated gradients are live
  // through the forward: measure the step that way.
  fo.strategies.zero_grad_set_to_none = false;
  fo.max_batch = run.batch;
  fo.progress = run.progress;
  run.progress.step("micro-batch: the largest of " + std::to_string(run.batch) +
                    " that fits " + format_bytes(run.budget));
  try {
    const BatchFit fit = fit_model(*probe, fo);
    if (fit.max_batch < run.batch) o.micro_batch = fit.max_batch;
    if (!run.json) {
      std::cout << "micro-batch " << std::min(fit.max_batch, run.batch) << " from memfit fit ("
                << (fit.verified ? "verified" : "unverified") << ", peak "
                << format_bytes(fit.verified ? fit.measured_peak_bytes
                                             : fit.predicted_peak_bytes)
                << ")" << std::endl;
    }
  } catch (const DoesNotFit&) {
    // The Trainer's own message says what does not fit.
  }
}

// The one-line error of an OOM in step `s`: what ran out, where the batch
// is, and what to do.
void print_step_oom(const Args& args, const TrainRun& run, bool split, int64_t s,
                    int64_t data_bytes, const c10::OutOfMemoryError& e) {
  const std::string what = error_line(e.what_without_backtrace());
  std::cerr << "memfit train: out of memory at step " << s + 1 << " with batch " << run.batch
            << " (its inputs and targets, " << format_bytes(data_bytes)
            << ", stay on the host; each micro-batch is moved to the device of "
            << format_bytes(run.budget) << " as it runs): " << what << "; "
            << (split ? "see memfit advise"
                      : "run `memfit fit --model " + run.name + " --budget " +
                            args.get("budget", "") +
                            "` for the largest batch that fits, or drop "
                            "--no-split to split this one into micro-batches")
            << "\n";
}

// One step's line, or its object in the JSON's "steps".
void write_step(const TrainRun& run, JsonWriter& w, int64_t s, const StepReport& r) {
  if (run.json) {
    w.begin_object()
        .member("step", s + 1)
        .member("micro_batch", r.micro_batch)
        .member("micro_batches", r.micro_batches)
        .member("ooms_recovered", r.ooms_recovered)
        .member("samples", r.samples)
        .member("loss", r.loss)
        .member("peak_bytes", r.peak_bytes)
        .member("live_bytes", tracking::live_bytes(Device::kCPU))
        .end_object();
  } else {
    std::cout << "step " << s + 1 << ": batch " << run.batch << " as " << r.micro_batches
              << " x " << r.micro_batch << ", " << r.ooms_recovered
              << " OOMs recovered, loss " << r.loss << ", peak " << format_bytes(r.peak_bytes)
              << ", live " << format_bytes(tracking::live_bytes(Device::kCPU)) << std::endl;
  }
}

// The steps, on the simulated device that holds the model, its optimizer
// state and every batch; 2 when something does not fit.
int train_steps(const Args& args, const TrainRun& run, TrainerOptions o,
                const std::optional<AdvisePlan>& plan) {
  const std::string optimizer_name =
      plan && !plan->optimizer.empty() ? plan->optimizer : run.optimizer;
  SimulatedDevice device(run.budget);
  std::unique_ptr<TrainableModel> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  try {
    model = make_model(run.name, model_options(args));
    optimizer = make_optimizer(optimizer_name, model->module().parameters(), 1e-3);
    if (plan) o = apply_plan(*plan, *model, o);
  } catch (const c10::OutOfMemoryError& e) {
    std::cerr << "memfit train: out of memory: the model alone does not fit the "
                 "budget of " << format_bytes(run.budget) << ": "
              << error_line(e.what_without_backtrace()) << "\n";
    return 2;
  }
  Trainer trainer(model->module().parameters(),
                  [&] { if (optimizer) optimizer->step(); }, o,
                  coupled_layers_of(model->module()));
  // The batch stays on the host (outside the budget, as CPU memory beside a
  // GPU); each micro-batch is copied to the device as it runs.
  auto forward = [&](const at::Tensor& x) { return model->forward(x.clone()); };
  auto loss = [&](const at::Tensor& out, const at::Tensor& y) {
    return model->loss(out, y.clone());
  };
  JsonWriter w(true);
  if (run.json) {
    w.begin_object().member("model", run.name).member("batch", run.batch)
        .member("budget_bytes", run.budget);
    if (plan) w.member("plan", plan->summary).member("plan_found", plan->found);
    w.key("steps").begin_array();
  } else {
    // Steps of a big batch take seconds each: say what runs before it does.
    std::cout << "training " << run.steps << " step(s) of batch " << run.batch << " under "
              << format_bytes(run.budget) << " ..." << std::endl;
  }
  for (int64_t s = 0; s < run.steps; ++s) {
    run.progress.step("train step " + std::to_string(s + 1) + " of " +
                      std::to_string(run.steps) + ", batch " + std::to_string(run.batch));
    StepReport r;
    int64_t data_bytes = 0;
    try {
      std::optional<Batch> b;
      {
        HostMemory host;
        b = model->make_batch(run.batch, at::TensorOptions(), static_cast<uint64_t>(s));
      }
      data_bytes = b->inputs.nbytes() + b->target.nbytes();
      r = trainer.step(b->inputs, b->target, forward, loss);
    } catch (const c10::OutOfMemoryError& e) {
      print_step_oom(args, run, o.split, s, data_bytes, e);
      return 2;
    }
    write_step(run, w, s, r);
  }
  if (run.json) {
    w.end_array().end_object();
    std::cout << w.str() << "\n";
  }
  return 0;
}

}  // namespace

int train_command(const std::vector<std::string>& argv) {
  Args args(argv, {"model", "batch", "budget", "steps", "optimizer", "coupled",
                   "layers", "width", "heads", "context", "plan", "seed"},
            {"no-split", "json", "allow-approximate", "progress", "quiet"});
  const TrainRun run = read_run(args);
  TrainerOptions o;
  o.split = !args.has("no-split");
  o.coupled = args.choice("coupled", "error", {"error", "allow"}) == "allow"
                  ? CoupledLayers::kAllow
                  : CoupledLayers::kError;
  const std::optional<AdvisePlan> plan = plan_of(args, run);
  if (o.split && !plan) fit_micro_batch(args, run, o);
  // --seed: the same initial weights in every run (torch seeds its default
  // generator at random per process).
  if (args.has("seed")) torch::manual_seed(static_cast<uint64_t>(args.get_int("seed", 0)));
  return train_steps(args, run, o, plan);
}

}  // namespace memfit::cli
