#include "memfit/torch/fit.h"

#include <c10/util/Exception.h>

#include <stdexcept>

#include "memfit/core/batch_search.h"

namespace memfit {

BatchFit fit_model(TrainableModel& model, const FitOptions& options) {
  if (options.budget < 0) {
    throw std::invalid_argument("[fit] the budget must be >= 0 bytes, got " +
                                std::to_string(options.budget));
  }
  MeasureStep measure = [&](int64_t batch) {
    ProfileOptions o;
    o.batch = batch;
    o.optimizer = options.optimizer;
    o.mode = options.mode;
    o.seed = options.seed;
    o.strategies = options.strategies;
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
  SearchOptions s;
  s.budget_bytes = options.budget;
  s.extra_margin_bytes = options.extra_margin;
  s.probes.first = options.probes;
  s.verify = options.verify;
  s.max_batch = options.max_batch;
  if (options.mode != "meta") s.host_limit_bytes = probe_memory_limit();
  return search_batch(measure, s);
}

}  // namespace memfit
