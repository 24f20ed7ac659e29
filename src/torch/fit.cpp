#include "memfit/torch/fit.h"

#include <stdexcept>

namespace memfit {

BatchFit fit_model(TrainableModel& model, const FitOptions& options) {
  if (options.budget < 0) {
    throw std::invalid_argument("[fit] the budget must be >= 0 bytes, got " +
                                std::to_string(options.budget));
  }
  std::vector<Profile> profiles;
  for (int64_t b : options.probes) {
    ProfileOptions o;
    o.batch = b;
    o.optimizer = options.optimizer;
    o.mode = options.mode;
    o.seed = options.seed;
    profiles.push_back(profile_model(model, o));
  }
  const PeakModel pm = fit_peak_model(options.probes, profiles);
  BatchFit f = fit_batch(pm, profiles.front().report, options.budget,
                         options.extra_margin);
  f.trials = 0;  // probes are small batches, not full-size trials
  return f;
}

}  // namespace memfit
