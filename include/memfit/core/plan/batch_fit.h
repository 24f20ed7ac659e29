// The largest batch whose whole training step stays under a budget, from the
// peak model of a few probes: no trial-and-error crashes.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "memfit/core/model/peak_model.h"
#include "memfit/core/model/report.h"

namespace memfit {

// The step does not fit the budget even at batch 1. The message says what
// the model needs, with the numbers, and what to try.
class DoesNotFit : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One measured batch, as the batch search saw it (batch_search.h).
struct ProbeRecord {
  int64_t batch = 0;
  bool out_of_memory = false;    // the step raised an out-of-memory error
  int64_t peak_bytes = 0;        // measured (0 when out_of_memory)
  int64_t predicted_bytes = -1;  // by the probes before it; -1: none made
  bool verification = false;     // a full-size step at a candidate answer
};

// Read as lines or JSON by render/fit_text.h.
struct BatchFit {
  int64_t max_batch = 0;
  int64_t recommended_batch = 0;  // see recommended_batch()
  int64_t predicted_peak_bytes = 0;  // at max_batch
  int64_t budget_bytes = 0;
  int64_t margin_bytes = 0;  // kept free below the budget, see Note [Fit margin]
  int trials = 0;            // real steps run at full size to find it
  std::string mode;          // the mode the probes ran in
  std::string peak_phase;    // where the peak is at max_batch
  int peak_iteration = 0;
  double bytes_per_sample = 0;  // of the phase holding the peak
  int64_t fixed_bytes = 0;      // that phase at batch 0
  // A whole step (two iterations) ran at max_batch and stayed under
  // budget - margin; false with verify off, and in meta mode, where sizes
  // are exact but no kernel ran. See Note [Verifying the answer].
  bool verified = false;
  int64_t measured_peak_bytes = -1;  // at max_batch; -1 when not measured
  std::vector<ProbeRecord> probes;   // every step the search measured
  double held_out_error = 0;  // worst relative miss predicting a probe
  bool affine = true;         // every probe was predicted within tolerance
  std::vector<std::string> notes;
};

// The batch to use of the largest that fits: the largest multiple of 8 at or
// below it (friendlier to tensor cores and vectorised kernels) when that
// gives up at most an eighth of max_batch, else max_batch itself: 63 -> 56,
// 12 -> 12 (8 would lose a third), 9 -> 8, 0 -> 0.
int64_t recommended_batch(int64_t max_batch);

// The fit's own margin: its largest residual over the probes, in whole
// bytes (0 for an exactly affine step). See Note [Fit margin].
int64_t residual_margin(const PeakModel& model);

// Note [Fit margin]
// The margin is what the prediction may be off by, not a hidden haircut: the
// largest residual of the probes' fits (0 when the step is exactly affine, as
// on the simulated device) plus `extra_margin_bytes` (e.g. for a real GPU's
// allocator). The peak must stay at or below budget - margin.
//
// `reference` is one probe's report, for the numbers in the error when even
// batch 1 does not fit. Throws DoesNotFit then; std::invalid_argument for a
// negative budget or margin.
BatchFit fit_batch(const PeakModel& model, const Report& reference,
                   int64_t budget_bytes, int64_t extra_margin_bytes = 0);

}  // namespace memfit
