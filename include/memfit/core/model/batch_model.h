// Memory as a function of the batch: M(b) = M0 + m*b, fitted and checked.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace memfit {

// Batch sizes at or above this are not searched: max_batch_under() caps its
// answer here rather than overflow.
inline constexpr int64_t kMaxBatch = int64_t{1} << 40;

// ceil(x) in whole bytes, clamped to [0, INT64_MAX]; a value within 1e-6 B
// of an integer counts as that integer, so rounding error in an exact fit
// does not add a byte. Every prediction rounds through here.
int64_t ceil_bytes(long double x);

struct AffineFit {
  double m0 = 0;          // bytes at batch 0: parameters, state, fixed parts
  double per_sample = 0;  // bytes per sample
  double max_abs_residual = 0;  // bytes, over the fitted points
  double max_rel_residual = 0;  // |residual| / measured bytes (1 B at least)
  int points = 0;
  int distinct_batches = 0;

  // ceil(m0 + per_sample * batch) in whole bytes, clamped to [0, INT64_MAX].
  // A value within 1e-6 B of an integer counts as that integer, so rounding
  // error in an exact fit does not add a byte.
  int64_t predict(int64_t batch) const;
  // The largest b in [0, kMaxBatch] with predict(b) <= budget, so that
  // predict(b) <= budget < predict(b + 1) below the cap; 0 when even a batch
  // of 1 does not fit. Throws std::runtime_error when batch 1 fits and the
  // memory does not grow with the batch (per_sample <= 0): every batch
  // would fit, which says the measurements are wrong.
  int64_t max_batch_under(int64_t budget) const;
  // Whether every fitted point lies within rel_tolerance of the line.
  // Trivially true for two distinct batches: see checked().
  bool is_affine(double rel_tolerance = 0.01) const;
  // Whether the fit was tested at all: three or more distinct batches.
  bool checked() const { return distinct_batches >= 3; }
};

// Least-squares fit of (batch, bytes) points; exact through two points.
// Throws std::invalid_argument for fewer than two points or two distinct
// batches, a batch <= 0, or negative bytes.
AffineFit fit_affine(
    const std::vector<std::pair<int64_t, int64_t>>& batch_bytes);

}  // namespace memfit
