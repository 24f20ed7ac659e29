// The peak of a step as a function of the batch, from profiles at a few
// batches. See Note [Predicting the peak at any batch].
#pragma once

#include <string>
#include <vector>

#include "memfit/core/batch_model.h"
#include "memfit/core/report.h"

namespace memfit {

// Note [Predicting the peak at any batch]
// The step's peak is the largest of its phases' peaks, and each phase's peak
// is close to affine in the batch: parameters, gradients and optimizer state
// are constant; activations and their temporaries grow per sample. The peak
// itself is not affine: it moves from the optimizer step (small batches) to
// backward (large ones). So each (phase, iteration) gets its own fit
// M(b) = M0 + m*b, and the prediction is the largest of them.
struct PhaseFit {
  std::string phase;
  int iteration = 0;
  AffineFit fit;
};

struct PeakModel {
  std::string mode;  // the mode the probes ran in
  std::vector<int64_t> probe_batches;
  std::vector<int64_t> probe_peaks;  // measured peak at each probe
  std::vector<PhaseFit> phases;
  std::vector<std::string> notes;

  int64_t predict(int64_t batch) const;
  // The phase holding the peak at `batch`.
  const PhaseFit& peak_phase(int64_t batch) const;
  // Largest relative residual over all phase fits at the probes.
  double max_rel_residual() const;
  // Largest batch whose predicted peak is <= budget (0 if none).
  int64_t max_batch_under(int64_t budget) const;
};

// One report per probe batch, all of the same step (same phases in the same
// order). Throws std::invalid_argument otherwise, or for fewer than two.
PeakModel fit_peak_model(const std::vector<int64_t>& batches,
                         const std::vector<Report>& reports);

}  // namespace memfit
