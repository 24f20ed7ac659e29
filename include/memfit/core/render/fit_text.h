// How a BatchFit reads: the lines `memfit fit` prints and its JSON, for
// both fronts (memfit.find_batch_size's result.text() and to_json()).
#pragma once

#include <string>

#include "memfit/core/plan/batch_fit.h"

namespace memfit {

// Keys: max_batch, recommended_batch, predicted_peak_bytes, budget_bytes,
// margin_bytes, trials, mode, verified, measured_peak_bytes (null when
// not measured), held_out_error, affine, probes [{batch, peak_bytes,
// predicted_bytes, out_of_memory, verification}], notes.
std::string to_json(const BatchFit& fit, bool pretty = true);
// The answer, its predicted and measured peaks, the probes and the notes.
std::string to_text(const BatchFit& fit);

}  // namespace memfit
