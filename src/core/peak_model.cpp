#include "memfit/core/peak_model.h"

#include <algorithm>
#include <stdexcept>

namespace memfit {

int64_t PeakModel::predict(int64_t batch) const {
  return peak_phase(batch).fit.predict(batch);
}

const PhaseFit& PeakModel::peak_phase(int64_t batch) const {
  if (phases.empty()) {
    throw std::logic_error("[PeakModel] no phases were fitted");
  }
  return *std::max_element(phases.begin(), phases.end(),
                           [&](const PhaseFit& a, const PhaseFit& b) {
                             return a.fit.predict(batch) < b.fit.predict(batch);
                           });
}

double PeakModel::max_rel_residual() const {
  double r = 0;
  for (const auto& p : phases) r = std::max(r, p.fit.max_rel_residual);
  return r;
}

int64_t PeakModel::max_batch_under(int64_t budget) const {
  // Every phase must fit; each fit's own bound is exact for that phase.
  int64_t best = -1;
  for (const auto& p : phases) {
    const int64_t b = p.fit.max_batch_under(budget);
    best = best < 0 ? b : std::min(best, b);
  }
  return std::max<int64_t>(best, 0);
}

PeakModel fit_peak_model(const std::vector<int64_t>& batches,
                         const std::vector<Report>& reports) {
  if (batches.size() != reports.size() || batches.size() < 2) {
    throw std::invalid_argument(
        "[fit_peak_model] need one report per batch and at least two batches");
  }
  PeakModel pm;
  pm.mode = reports.front().mode;
  const auto& first = reports.front().phases;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> points(first.size());
  for (size_t r = 0; r < reports.size(); ++r) {
    const auto& rows = reports[r].phases;
    bool same = rows.size() == first.size();
    for (size_t i = 0; same && i < rows.size(); ++i) {
      same = rows[i].name == first[i].name && rows[i].iteration == first[i].iteration;
    }
    if (!same) {
      throw std::invalid_argument(
          "[fit_peak_model] the step ran different phases at batch " +
          std::to_string(batches[r]) + " than at batch " +
          std::to_string(batches[0]));
    }
    for (size_t i = 0; i < rows.size(); ++i) {
      points[i].push_back({batches[r], rows[i].peak_bytes});
    }
    pm.probe_batches.push_back(batches[r]);
    pm.probe_peaks.push_back(reports[r].peak_bytes);
    for (const auto& n : reports[r].notes) {
      if (std::find(pm.notes.begin(), pm.notes.end(), n) == pm.notes.end()) {
        pm.notes.push_back(n);
      }
    }
  }
  for (size_t i = 0; i < first.size(); ++i) {
    pm.phases.push_back({first[i].name, first[i].iteration, fit_affine(points[i])});
  }
  return pm;
}

}  // namespace memfit
