// Finding the largest batch that fits by measuring toward it: probes grown
// geometrically toward the answer, each checked against the probes before
// it, and the answer verified by a whole step at that batch. The one home of
// the search: the C++ fit (built-in models) and memfit.find_batch_size
// (the user's nn.Module) each pass their own way of measuring a step.
// See Note [Probing toward the answer] and Note [Verifying the answer].
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "memfit/core/model/peak_model.h"
#include "memfit/core/model/report.h"
#include "memfit/core/model/timeline.h"
#include "memfit/core/plan/batch_fit.h"
#include "memfit/core/plan/progress.h"

namespace memfit {

// One training step (both iterations) measured at one batch.
struct StepMeasurement {
  // The step raised an out-of-memory error (a budget was enforced while it
  // ran): the batch does not fit, by how much is unknown.
  bool out_of_memory = false;
  Report report;      // unless out_of_memory
  Timeline timeline;  // unless out_of_memory; for the per-event envelope
};

// Runs the step at `batch` samples and says what it took. The front end
// catches its own out-of-memory error and sets out_of_memory; anything else
// it throws passes through the search.
using MeasureStep = std::function<StepMeasurement(int64_t batch)>;

// Note [Probing toward the answer]
// A step is affine in the batch only while its kernels keep their path. CPU
// kernels change algorithm with the batch and with the thread count, so a
// line through batches 4..16 was 25% low at 256 on a GroupNorm/SiLU net. So
// the probes grow (x2) from `first` toward the batch being predicted; each
// new probe is first predicted from the ones before it (a held-out check),
// and the model is fitted on the largest probes only (at most three).
// Growth stops once the largest probe is within 8x of the target and the
// last held-out check agreed within `tolerance`: the probes then cost less
// than one step at the target (2 + 4 + ... + target/8 < target/4 samples,
// two iterations each). A check that fails keeps growth going up to half
// the target, and the model is reported as not affine, with the figures.
struct ProbePlan {
  std::vector<int64_t> first = {2, 4, 8};
  double tolerance = 0.005;  // relative held-out error still called affine
  // A probe whose peak is, or is predicted to be, above this is not grown
  // past (it would not fit, or would take the machine's memory).
  int64_t limit_bytes = INT64_MAX;
};

// The peak model of a step, and how far to trust it.
struct ProbedModel {
  PeakModel model;                  // fitted on the largest probes that fit
  std::vector<ProbeRecord> probes;  // in the order measured
  std::vector<StepMeasurement> measured;  // one per probe, same order
  double held_out_error = 0;  // worst |measured - predicted| / measured
  bool affine = true;         // every held-out check within tolerance
  std::vector<std::string> notes;

  int64_t largest_probe() const;  // largest probe batch that did not run out of memory
};

// Measures `first`, then grows toward target(model) (recomputed after each
// probe: for a fit the target is the answer itself). Throws
// std::invalid_argument when fewer than two probes could be measured under
// the limit (the caller decides what that means: batch 1 does not fit).
// Says "probe batch B" to `progress` before each step it measures.
ProbedModel probe_toward(const MeasureStep& measure,
                         const std::function<int64_t(const PeakModel&)>& target,
                         const ProbePlan& plan,
                         const Progress& progress = Progress());

// probe_toward a fixed `batch`: what a prediction at it needs. Throws
// std::invalid_argument for a batch outside 1 to kMaxBatch.
ProbedModel probe_toward_batch(const MeasureStep& measure, int64_t batch, const ProbePlan& plan,
                               const Progress& progress = Progress());

// How sure a prediction at `batch` is, for reports.
struct PredictionCertainty {
  int64_t batch = 0;
  int64_t predicted_bytes = 0;
  std::vector<int64_t> probes;  // batches the model was fitted on
  double held_out_error = 0;
  bool beyond_probes = false;   // batch > the largest probe
  bool affine = true;
  std::string faster_than_batch;  // See Note [An allocation that grows faster than the batch]
  // For a card (probes with a CUDA estimate): its budget peak (reserved
  // bytes) replayed on the step at `batch`, sized from the two largest
  // probes (Note [A card's reserve between two steps]); -1 when the probes
  // have no estimate or made different allocations.
  int64_t predicted_reserved_bytes = -1;
  // What else may put the prediction off, one line each, from the report
  // that asked (a line that missed a batch between its probes, a workspace
  // its mode leaves out); text() says them too.
  std::vector<std::string> notes;
  std::string text() const;     // one line
};
PredictionCertainty certainty_at(const ProbedModel& probed, int64_t batch);

// Note [Verifying the answer]
// The model's answer is run once as a whole step (two iterations) before it
// is returned. If it does not fit, the next candidate comes from the
// measured peak, not from halving: the secant through the largest batch
// known to fit and the failed one, solved for the budget; and it is
// verified again. If it fits with room for another 2% of batch, the same
// secant is tried upward (a full-size step costs more than all the probes:
// the goal is >= 98% of the true maximum with one such step). The answer is always a batch that was
// measured to fit (a probe or a verification step) unless verify is false;
// then it is the model's answer and BatchFit::verified is false. For a
// CUDA card the candidates come instead from the caching allocator replayed
// on a step interpolated between two measured ones, which sees the
// reserve's stairs (Note [A card's reserve between two steps]); the secant
// takes over where the steps allocate differently or a candidate inside a
// bracket fails.
struct SearchOptions {
  int64_t budget_bytes = 0;
  int64_t extra_margin_bytes = 0;  // kept free below the budget
  ProbePlan probes;
  bool verify = true;
  int max_trials = 4;  // full-size verification steps at most
  // No step predicted above this runs, probe or verification: a cpu-mode
  // step takes this machine's RAM (see probe_memory_limit()). The answer is
  // then unverified, and the notes say why.
  int64_t host_limit_bytes = INT64_MAX;
  // No batch above this is wanted (a Trainer's whole batch): the search
  // stops there, and costs at most a step at it.
  int64_t max_batch = kMaxBatch;
  // Told before each step runs: "probe batch 64", "verify batch 412"
  // (with the model's prediction once there is one). Silent by default.
  Progress progress;
};

// What one measured step in `mode` may take: on meta no memory at all
// (INT64_MAX); otherwise an eighth of this machine's physical memory (2 GiB
// when unknown): what a probe in cpu mode may take (the step's copies of the batch and the
// allocator's slack come on top) without making the machine swap.
int64_t probe_memory_limit(const std::string& mode);

// Throws DoesNotFit (with the numbers and what to try) when even batch 1
// does not fit; std::invalid_argument for a max_batch < 1, a negative
// budget or margin. A max_batch above kMaxBatch is kMaxBatch.
BatchFit search_batch(const MeasureStep& measure, const SearchOptions& options);

}  // namespace memfit
