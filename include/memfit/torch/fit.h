// The largest batch of a model that fits a budget: probes at small batches,
// the peak model, no crashes. See Note [Fit margin].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memfit/core/batch_fit.h"
#include "memfit/torch/models.h"
#include "memfit/torch/profile.h"

namespace memfit {

struct FitOptions {
  int64_t budget = 0;
  std::string optimizer = "adam";
  std::string mode = "cpu";
  std::vector<int64_t> probes = {4, 8, 16};
  int64_t extra_margin = 0;  // added to the fit's own margin
  uint64_t seed = 0;
};

// Throws DoesNotFit (with the numbers and what to try) when even batch 1
// does not fit; std::invalid_argument for a negative budget.
BatchFit fit_model(TrainableModel& model, const FitOptions& options);

}  // namespace memfit
