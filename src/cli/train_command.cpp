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
int train_command(const std::vector<std::string>& argv) {
  Args args(argv, {"model", "batch", "budget", "steps", "optimizer", "coupled",
                   "layers", "width", "heads", "context", "plan", "seed"},
            {"no-split", "json", "allow-approximate", "progress", "quiet"});
  const std::string name = args.require("model");
  const int64_t batch = args.get_count("batch", 64);
  const int64_t steps = args.get_count("steps", 3);
  const int64_t budget = args.get_size("budget", 1);
  const std::string opt_name =
      args.choice("optimizer", "adam", optimizer_names());
  TrainerOptions o;
  o.split = !args.has("no-split");
  o.coupled = args.choice("coupled", "error", {"error", "allow"}) == "allow"
                  ? CoupledLayers::kAllow
                  : CoupledLayers::kError;
  const bool json = args.has("json");
  const Progress progress = progress_of(args);
  std::optional<AdvisePlan> plan;
  std::string opt_used = opt_name;
  if (args.choice("plan", "none", {"none", "auto"}) == "auto") {
    // Measured on a model of the same shape, before the budget is in force.
    AdviseOptions ao;
    ao.batch = batch;
    ao.budget = budget;
    ao.optimizer = opt_name;
    ao.allow_approximate = args.has("allow-approximate");
    ao.timing_repeats = 0;  // the plan is what trains; its time is only said, estimated
    // Advising must not move the weights the run starts from (the probe's
    // initialisation draws from the default generator): the same command
    // with and without --plan trains the same model.
    auto generator = at::detail::getDefaultCPUGenerator();
    const at::Tensor rng_state = generator.get_state();
    auto probe = make_model(name, model_options(args));
    progress.step("plan: measure the strategies for batch " + std::to_string(batch) +
                  " under " + format_bytes(budget));
    const Advice advice = advise(*probe, ao);
    generator.set_state(rng_state);
    plan = advice.plan;
    opt_used = plan->optimizer.empty() ? opt_name : plan->optimizer;
    if (!json) {
      std::cout << "plan: " << plan->summary
                << (plan->found ? "" : " (nothing measured fits the budget)") << "\n";
    }
  }

  if (o.split && !plan) {
    // The first micro-batch is the fit's verified answer (Note [Verifying
    // the answer]), not found by running out of memory; OOM recovery stays
    // the safety net. Measured on a model of the same shape, the generator
    // put back as --plan does.
    auto generator = at::detail::getDefaultCPUGenerator();
    const at::Tensor rng_state = generator.get_state();
    auto probe = make_model(name, model_options(args));
    FitOptions fo;
    fo.budget = budget;
    fo.optimizer = opt_name;
    // From the second micro-batch on, the accumulated gradients are live
    // through the forward: measure the step that way.
    fo.strategies.zero_grad_set_to_none = false;
    fo.max_batch = batch;
    fo.progress = progress;
    progress.step("micro-batch: the largest of " + std::to_string(batch) + " that fits " +
                  format_bytes(budget));
    try {
      const BatchFit fit = fit_model(*probe, fo);
      if (fit.max_batch < batch) o.micro_batch = fit.max_batch;
      if (!json) {
        std::cout << "micro-batch " << std::min(fit.max_batch, batch) << " from memfit fit ("
                  << (fit.verified ? "verified" : "unverified") << ", peak "
                  << format_bytes(fit.verified ? fit.measured_peak_bytes
                                               : fit.predicted_peak_bytes)
                  << ")" << std::endl;
      }
    } catch (const DoesNotFit&) {
      // The Trainer's own message says what does not fit.
    }
    generator.set_state(rng_state);
  }

  // --seed: the same initial weights in every run (torch seeds its default
  // generator at random per process).
  if (args.has("seed")) torch::manual_seed(static_cast<uint64_t>(args.get_int("seed", 0)));
  // The simulated device holds everything: the model, its optimizer state,
  // every batch.
  SimulatedDevice device(budget);
  std::unique_ptr<TrainableModel> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  try {
    model = make_model(name, model_options(args));
    optimizer = make_optimizer(opt_used, model->module().parameters(), 1e-3);
    if (plan) o = apply_plan(*plan, *model, o);
  } catch (const c10::OutOfMemoryError& e) {
    std::cerr << "memfit train: out of memory: the model alone does not fit the "
                 "budget of " << format_bytes(budget) << ": "
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
  if (json) {
    w.begin_object().member("model", name).member("batch", batch).member("budget_bytes", budget);
    if (plan) w.member("plan", plan->summary).member("plan_found", plan->found);
    w.key("steps").begin_array();
  }
  if (!json) {
    // Steps of a big batch take seconds each: say what runs before it does.
    std::cout << "training " << steps << " step(s) of batch " << batch << " under "
              << format_bytes(budget) << " ..." << std::endl;
  }
  for (int64_t s = 0; s < steps; ++s) {
    progress.step("train step " + std::to_string(s + 1) + " of " + std::to_string(steps) +
                  ", batch " + std::to_string(batch));
    StepReport r;
    int64_t data_bytes = 0;
    try {
      std::optional<Batch> b;
      {
        HostMemory host;
        b = model->make_batch(batch, at::TensorOptions(), static_cast<uint64_t>(s));
      }
      data_bytes = b->inputs.nbytes() + b->target.nbytes();
      r = trainer.step(b->inputs, b->target, forward, loss);
    } catch (const c10::OutOfMemoryError& e) {
      const std::string what = error_line(e.what_without_backtrace());
      // One line: what ran out, where the batch is, and what to do.
      std::cerr << "memfit train: out of memory at step " << s + 1 << " with batch "
                << batch << " (its inputs and targets, " << format_bytes(data_bytes)
                << ", stay on the host; each micro-batch is moved to the device of "
                << format_bytes(budget) << " as it runs): " << what << "; "
                << (o.split ? "see memfit advise"
                            : "run `memfit fit --model " + name + " --budget " +
                                  args.get("budget", "") +
                                  "` for the largest batch that fits, or drop "
                                  "--no-split to split this one into micro-batches")
                << "\n";
      return 2;
    }
    if (json) {
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
      std::cout << "step " << s + 1 << ": batch " << batch << " as " << r.micro_batches
                << " x " << r.micro_batch << ", " << r.ooms_recovered
                << " OOMs recovered, loss " << r.loss << ", peak "
                << format_bytes(r.peak_bytes) << ", live "
                << format_bytes(tracking::live_bytes(Device::kCPU)) << std::endl;
    }
  }
  if (json) {
    w.end_array().end_object();
    std::cout << w.str() << "\n";
  }
  return 0;
}

}  // namespace memfit::cli
