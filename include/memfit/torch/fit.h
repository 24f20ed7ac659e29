// The largest batch of a built-in model that fits a budget: probes grown
// toward the answer, and the answer verified by a whole step. See
// Note [Probing toward the answer] and Note [Verifying the answer].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memfit/core/plan/batch_fit.h"
#include "memfit/core/plan/batch_search.h"
#include "memfit/torch/models.h"
#include "memfit/torch/profile.h"

namespace memfit {

struct FitOptions {
  int64_t budget = 0;
  std::string optimizer = "adam";
  std::string mode = "cpu";
  std::vector<int64_t> probes = {2, 4, 8};  // the first probes; more grow from them
  int64_t extra_margin = 0;  // kept free below the budget
  bool verify = true;        // run a whole step at the answer before returning it
  uint64_t seed = 0;
  // How the measured step runs; a Trainer's micro-batch is measured with
  // zero_grad_set_to_none off: accumulated gradients live through the
  // next micro-batch's forward.
  StepStrategies strategies;
  int64_t max_batch = kMaxBatch;  // none larger is wanted: the search stops there
  // For a CUDA card (ProfileOptions::cuda_target): each step is held
  // against the caching allocator's reserved bytes.
  bool cuda_target = false;
  int64_t cuda_workspace = kDefaultCudaWorkspaceBytes;
  Progress progress;  // told each probe and verification (SearchOptions::progress)
};

// The step of `model` as `base` runs it, at any batch: what the batch search
// and probe_toward (batch_search.h) measure. An OOM of a simulated device
// in force comes back as out_of_memory.
MeasureStep measure_model(TrainableModel& model, const ProfileOptions& base);

// Throws DoesNotFit (with the numbers and what to try) when even batch 1
// does not fit; std::invalid_argument for a negative budget.
BatchFit fit_model(TrainableModel& model, const FitOptions& options);

}  // namespace memfit
