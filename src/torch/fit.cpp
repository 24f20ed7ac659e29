#include "memfit/torch/fit.h"

#include <c10/util/Exception.h>

#include <stdexcept>


namespace memfit {

MeasureStep measure_model(TrainableModel& model, const ProfileOptions& base) {
  return [&model, base](int64_t batch) {
    ProfileOptions o = base;
    o.batch = batch;
    StepMeasurement m;
    try {
      Profile p = profile_model(model, o);
      m.report = std::move(p.report);
      m.timeline = std::move(p.timeline);
    } catch (const c10::OutOfMemoryError&) {
      m.out_of_memory = true;  // a simulated device's budget is in force
    }
    return m;
  };
}

// The budget and margin are checked once, by search_batch (the one entry
// every front reaches: this one, the CLI after its flags, Python's
// find_batch_size).
BatchFit fit_model(TrainableModel& model, const FitOptions& options) {
  ProfileOptions base;
  base.optimizer = options.optimizer;
  base.mode = options.mode;
  base.seed = options.seed;
  base.strategies = options.strategies;
  base.cuda_target = options.cuda_target;
  base.cuda_workspace = options.cuda_workspace;
  SearchOptions s;
  s.budget_bytes = options.budget;
  s.extra_margin_bytes = options.extra_margin;
  s.probes.first = options.probes;
  s.verify = options.verify;
  s.max_batch = options.max_batch;
  s.host_limit_bytes = probe_memory_limit(options.mode);
  s.progress = options.progress;
  return search_batch(measure_model(model, base), s);
}

}  // namespace memfit
