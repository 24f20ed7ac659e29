// Runs training iterations of a model under the recorder and explains them;
// predicts the peak at batches that were not run.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "memfit/core/model/optimizers.h"
#include "memfit/core/model/peak_model.h"
#include "memfit/core/model/report.h"
#include "memfit/core/model/timeline.h"
#include "memfit/core/plan/progress.h"
#include "memfit/torch/models.h"

namespace torch::optim {
class Optimizer;
}

namespace memfit {

// How a step runs: each choice is a strategy `memfit advise` measures.
struct StepStrategies {
  enum class Step {
    kTrain,          // forward, loss, backward, optimizer step, zero_grad
    kEvalNoGrad,     // forward and loss under no_grad
    kEvalInference,  // forward and loss under inference mode
  };
  Step step = Step::kTrain;
  // Blocks of the model's chain to checkpoint; empty: none.
  std::vector<bool> checkpoint;
  // Forward and loss under CPU autocast in bfloat16 (backward outside it,
  // as torch.autocast does).
  bool autocast_bf16 = false;
  // zero_grad(set_to_none=True) (the default), or zeroing in place: the
  // gradients then stay through the next forward, as they do between the
  // micro-batches of an accumulated step.
  bool zero_grad_set_to_none = true;
};

struct ProfileOptions {
  int64_t batch = 64;
  std::string optimizer = "adam";  // one of optimizer_names()
  std::string mode = "cpu";        // cpu | meta (meta falls back to cpu)
  int iterations = 2;
  uint64_t seed = 0;
  double lr = 1e-3;
  StepStrategies strategies;
  // For a CUDA card: the report gets the caching allocator's estimate
  // (Report::cuda) with cuda_workspace bytes of cuBLAS workspace, and
  // budgets are held against its reserved bytes (Report::budget_peak).
  bool cuda_target = false;
  int64_t cuda_workspace = kDefaultCudaWorkspaceBytes;
  // Told each phase as its recording starts ("record batch 64 on meta:
  // forward (iteration 1)") and the explaining after: a meta step of a
  // large model takes seconds a phase. Silent by default.
  Progress progress;
};

struct Profile {
  Report report;
  Timeline timeline;
};

// The built-in optimizer `name` (core/model/optimizers.h: adam,
// adam-offload with its state and step on the host (host_offload.h),
// momentum, sgd, none) over `params` with learning rate `lr`; nullptr for
// one with no torch class ("none"). Throws std::invalid_argument for a name
// not in optimizer_names().
std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const std::string& name, std::vector<at::Tensor> params, double lr);

// Throws std::invalid_argument for a batch < 1, iterations < 1, an unknown
// optimizer or mode; c10::OutOfMemoryError if a simulated device is in force
// and the step does not fit.
Profile profile_model(TrainableModel& model, const ProfileOptions& options);

// Profiles the model at `probe_batches` (three distinct batches check the
// fit; two only make it) and fits each phase.
// See Note [Predicting the peak at any batch].
PeakModel probe_peak_model(TrainableModel& model, const ProfileOptions& options,
                         const std::vector<int64_t>& probe_batches = {4, 8, 16});

// The peak model of profiles already run, one per batch.
PeakModel fit_peak_model(const std::vector<int64_t>& batches,
                         const std::vector<Profile>& profiles);

}  // namespace memfit
