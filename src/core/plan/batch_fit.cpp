#include "memfit/core/plan/batch_fit.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "memfit/core/model/optimizers.h"
#include "memfit/core/model/units.h"

namespace memfit {
namespace {

int64_t optimizer_state_bytes(const Report& r) {
  for (const auto& p : r.phases) {
    if (p.name == kPhaseOptimizerStep && p.iteration == 1) return p.delta_bytes;
  }
  return 0;
}

std::string advice(const Report& r) {
  std::string a = "Try a bigger budget";
  const std::string& opt = r.optimizer;
  if (optimizer_is_adam(opt) && !optimizer_on_host(opt)) {
    a += ", Adam's state on the host (--optimizer adam-offload, "
         "memfit.offload: the same training, slower steps), --optimizer "
         "momentum (1x parameters of state instead of Adam's 2x) or sgd (none)";
  }
  a += ", mixed precision, or activation checkpointing (memfit advise plans "
       "and measures these)";
  return a + ".";
}

}  // namespace

int64_t residual_margin(const PeakModel& model) {
  int64_t residual = 0;
  for (const auto& p : model.phases) {
    residual = std::max(residual, static_cast<int64_t>(std::ceil(p.fit.max_abs_residual)));
  }
  return residual;
}

int64_t recommended_batch(int64_t max_batch) {
  const int64_t multiple = max_batch / 8 * 8;
  return multiple > 0 && (max_batch - multiple) * 8 <= max_batch ? multiple : max_batch;
}

BatchFit fit_batch(const PeakModel& model, const Report& reference,
                   int64_t budget_bytes, int64_t extra_margin_bytes) {
  if (budget_bytes < 0 || extra_margin_bytes < 0) {
    throw std::invalid_argument("[fit_batch] budget and margin must be >= 0");
  }
  const int64_t residual = residual_margin(model);
  BatchFit f;
  f.budget_bytes = budget_bytes;
  f.margin_bytes = residual + extra_margin_bytes;
  f.mode = model.mode;
  const int64_t usable = budget_bytes - f.margin_bytes;
  if (extra_margin_bytes > 0 && extra_margin_bytes >= budget_bytes) {
    // The margin, not the model, is what leaves nothing: say so, not
    // optimizer advice.
    throw std::invalid_argument("[fit_batch] the margin " + format_bytes(extra_margin_bytes) +
                                " leaves nothing of the budget " + format_bytes(budget_bytes) +
                                ": give a margin smaller than the budget");
  }
  const int64_t one = model.predict(1);
  if (usable < one) {
    const PhaseFit& at = model.peak_phase(1);
    const int64_t fixed = model.predict(0);
    std::ostringstream msg;
    const int64_t params = reference.parameter_bytes;
    const int64_t state = optimizer_state_bytes(reference);
    if (usable < fixed) {
      msg << "[fit_batch] budget " << format_bytes(budget_bytes)
          << " is below what the model needs before any sample: "
          << format_bytes(fixed) << " at the peak of " << at.phase
          << " (parameters " << format_bytes(params) << ", gradients up to "
          << format_bytes(params) << ", optimizer state " << format_bytes(state)
          << ", and the step's temporaries)";
    } else {
      msg << "[fit_batch] even one sample does not fit: batch 1 needs "
          << format_bytes(one) << " at the peak of " << at.phase
          << " (iteration " << at.iteration << "), budget "
          << format_bytes(budget_bytes);
    }
    if (f.margin_bytes > 0) msg << " less a margin of " << format_bytes(f.margin_bytes);
    msg << ". " << advice(reference);
    throw DoesNotFit(msg.str());
  }
  f.max_batch = model.max_batch_under(usable);
  f.recommended_batch = recommended_batch(f.max_batch);
  f.predicted_peak_bytes = model.predict(f.max_batch);
  const PhaseFit& at = model.peak_phase(f.max_batch);
  f.peak_phase = at.phase;
  f.peak_iteration = at.iteration;
  f.bytes_per_sample = at.fit.per_sample;
  f.fixed_bytes = at.fit.predict(0);
  return f;
}

}  // namespace memfit
