#include "memfit/core/model/batch_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>

namespace memfit {

namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

}  // namespace

int64_t ceil_bytes(long double x) {
  const long double nearest = std::nearbyint(x);
  if (std::fabs(x - nearest) < 1e-6L) x = nearest;
  const long double c = std::ceil(x);
  if (c <= 0) return 0;
  if (c >= static_cast<long double>(kInt64Max)) return kInt64Max;
  return static_cast<int64_t>(c);
}

int64_t AffineFit::predict(int64_t batch) const {
  return ceil_bytes(static_cast<long double>(m0) +
                    static_cast<long double>(per_sample) *
                        static_cast<long double>(batch));
}

int64_t AffineFit::max_batch_under(int64_t budget) const {
  if (predict(1) > budget) return 0;
  if (per_sample <= 0) {
    throw std::runtime_error(
        "[max_batch_under] memory does not grow with the batch (per-sample " +
        std::to_string(per_sample) +
        " bytes), so every batch fits: measure at batches far enough apart "
        "that activations show");
  }
  // Start from the real-valued solution, then step until consistent with
  // predict(), which is the definition.
  const long double exact =
      (static_cast<long double>(budget) - static_cast<long double>(m0)) /
      static_cast<long double>(per_sample);
  int64_t b = exact >= static_cast<long double>(kMaxBatch)
                  ? kMaxBatch
                  : std::max<int64_t>(1, static_cast<int64_t>(exact));
  while (b > 1 && predict(b) > budget) --b;
  while (b < kMaxBatch && predict(b + 1) <= budget) ++b;
  return b;
}

bool AffineFit::is_affine(double rel_tolerance) const {
  return max_rel_residual <= rel_tolerance;
}

AffineFit fit_affine(
    const std::vector<std::pair<int64_t, int64_t>>& batch_bytes) {
  if (batch_bytes.size() < 2) {
    throw std::invalid_argument(
        "[fit_affine] " + std::to_string(batch_bytes.size()) +
        " point(s) cannot fix a line: measure at two or more batch sizes");
  }
  std::set<int64_t> batches;
  for (const auto& [batch, bytes] : batch_bytes) {
    if (batch <= 0) {
      throw std::invalid_argument("[fit_affine] batch " +
                                  std::to_string(batch) +
                                  " is not positive: measure at batches >= 1");
    }
    if (bytes < 0) {
      throw std::invalid_argument("[fit_affine] " + std::to_string(bytes) +
                                  " bytes at batch " + std::to_string(batch) +
                                  " is negative: give measured bytes >= 0");
    }
    batches.insert(batch);
  }
  if (batches.size() < 2) {
    throw std::invalid_argument(
        "[fit_affine] every point is at batch " +
        std::to_string(*batches.begin()) +
        ": measure at two or more different batch sizes");
  }

  // Centred sums keep the arithmetic well conditioned for byte counts in
  // the 1e10 range.
  const long double n = static_cast<long double>(batch_bytes.size());
  long double mean_b = 0, mean_y = 0;
  for (const auto& [batch, bytes] : batch_bytes) {
    mean_b += static_cast<long double>(batch);
    mean_y += static_cast<long double>(bytes);
  }
  mean_b /= n;
  mean_y /= n;
  long double sxx = 0, sxy = 0;
  for (const auto& [batch, bytes] : batch_bytes) {
    const long double db = static_cast<long double>(batch) - mean_b;
    sxx += db * db;
    sxy += db * (static_cast<long double>(bytes) - mean_y);
  }
  const long double slope = sxy / sxx;
  const long double intercept = mean_y - slope * mean_b;

  AffineFit fit;
  fit.m0 = static_cast<double>(intercept);
  fit.per_sample = static_cast<double>(slope);
  fit.points = static_cast<int>(batch_bytes.size());
  fit.distinct_batches = static_cast<int>(batches.size());
  for (const auto& [batch, bytes] : batch_bytes) {
    const long double y = static_cast<long double>(bytes);
    const long double residual =
        std::fabs(y - (intercept + slope * static_cast<long double>(batch)));
    fit.max_abs_residual =
        std::max(fit.max_abs_residual, static_cast<double>(residual));
    fit.max_rel_residual =
        std::max(fit.max_rel_residual,
                 static_cast<double>(residual / std::max<long double>(y, 1)));
  }
  return fit;
}

}  // namespace memfit
