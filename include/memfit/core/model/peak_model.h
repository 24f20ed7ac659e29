// The peak of a step as a function of the batch, from profiles at a few
// batches. See Note [Predicting the peak at any batch].
#pragma once

#include <string>
#include <vector>

#include "memfit/core/model/batch_model.h"
#include "memfit/core/model/report.h"
#include "memfit/core/model/timeline.h"

namespace memfit {

// Note [Predicting the peak at any batch]
// Live bytes after each event of a step are close to affine in the batch:
// parameters, gradients and optimizer state are constant; activations and
// their temporaries grow per sample. A phase's peak is the largest of its
// events' lines, and that is not affine: at small batches a constant buffer
// (a weight's gradient) may top it, at large ones an activation. Fitting the
// phase's peak from small probes then under-predicts large batches. So when
// the probes ran the same events (same ops, only sizes differ), every event
// gets its own line M(b) = M0 + m*b from the probes and a phase keeps the
// upper envelope of its lines: the prediction is exact for an affine step.
// When they did not, the phase's peak is fitted as one line, and the
// residual says how far to trust it.
struct Line {
  double fixed = 0;       // bytes at batch 0
  double per_sample = 0;  // bytes per sample
  double at(int64_t batch) const { return fixed + per_sample * static_cast<double>(batch); }
};

// The live bytes at an event that grow as the batch squared (See Note [An
// allocation that grows faster than the batch]), through three probes.
struct Curve {
  double fixed = 0, per_sample = 0, per_sample_squared = 0;
  double at(int64_t batch) const {
    const double b = static_cast<double>(batch);
    return fixed + per_sample * b + per_sample_squared * b * b;
  }
};

struct PhaseFit {
  std::string phase;
  int iteration = 0;
  AffineFit fit;                // of the phase's peak (also for reports)
  std::vector<Line> envelope;   // per-event lines on the upper hull; may be empty
  std::vector<Curve> curves;    // events whose live bytes grow as batch squared
  int64_t predict(int64_t batch) const;
  // Largest batch whose prediction is <= budget; kMaxBatch if the phase does
  // not grow with the batch and fits; 0 if batch 1 does not fit.
  int64_t max_batch_under(int64_t budget) const;
};

// The lines of `lines` that are highest somewhere on batch >= 1.
std::vector<Line> upper_envelope(std::vector<Line> lines);

struct PeakModel {
  std::string mode;  // the mode the probes ran in
  std::vector<int64_t> probe_batches;
  std::vector<int64_t> probe_peaks;  // measured peak at each probe
  std::vector<PhaseFit> phases;
  std::vector<std::string> notes;
  // The largest allocation that grew faster than the batch between the two
  // largest probes, in words; empty if none. See Note [An allocation that
  // grows faster than the batch].
  std::string faster_than_batch;

  int64_t predict(int64_t batch) const;
  // The phase holding the peak at `batch`.
  const PhaseFit& peak_phase(int64_t batch) const;
  // Largest relative residual over all phase fits at the probes.
  double max_rel_residual() const;
  // Largest batch whose predicted peak is <= budget (0 if none).
  int64_t max_batch_under(int64_t budget) const;
};

// One report per probe batch, all of the same step (same phases in the same
// order), and optionally each probe's timeline for the per-event envelope.
// Throws std::invalid_argument otherwise, or for fewer than two.
PeakModel fit_peak_model(const std::vector<int64_t>& batches,
                         const std::vector<Report>& reports,
                         const std::vector<const Timeline*>& timelines = {});

}  // namespace memfit
