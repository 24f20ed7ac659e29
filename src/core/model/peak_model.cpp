#include "memfit/core/model/peak_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "memfit/core/model/units.h"

namespace memfit {

namespace {

// Whether line m is nowhere above both l and r on batch >= 1 (l, r sorted by
// slope, l < m < r).
bool useless(const Line& l, const Line& m, const Line& r) {
  // m is dominated when the crossing of l and r is at or above m there.
  const double x = (l.fixed - r.fixed) / (r.per_sample - l.per_sample);
  const double at = std::max(1.0, x);
  return m.fixed + m.per_sample * at <=
         std::max(l.fixed + l.per_sample * at, r.fixed + r.per_sample * at) + 1e-9;
}

// Note [An allocation that grows faster than the batch]
// Each event's line is fitted on the probes, and the probes are small: an
// allocation of B x B (a contrastive loss's similarity matrix, attention
// over the batch) is a few KiB there beside megabytes of weights, so the
// lines fit the probes exactly and the peak's held-out miss is 0.00%. At
// batch 256 that matrix tops the step: CLIP's pair of losses predicted
// 1.26 MiB where the step took 1.77 MiB (-29%), "held-out 0.00%, affine".
// So each allocation's size is followed over the (up to) three largest
// probes: one that grows more than 1.5x as fast as the batch from each to
// the next (4x for 2x the batch is batch squared) makes the prediction not
// affine, and says which. It must reach 4 KiB at the largest probe: below,
// alignment and packing move sizes by more than the batch does. Then the
// live bytes at each event that rise above the line of the two smaller
// probes by 1 KiB or more at the largest (the matrix and what is computed
// from it while it lives) get a curve through the three, not a line: the
// CLIP step's prediction at 256 is then the step's to the byte
// (python/tests/test_prediction_faster_than_batch.py).
constexpr int64_t kSmallestToJudge = 4096;
constexpr int64_t kCurvatureToJudge = 1024;
constexpr double kFasterThanBatch = 1.5;

// Indices of the (up to) three largest batches, ascending.
std::vector<size_t> largest_three(const std::vector<int64_t>& batches) {
  std::vector<size_t> order(batches.size());
  for (size_t r = 0; r < order.size(); ++r) order[r] = r;
  std::sort(order.begin(), order.end(),
            [&](size_t x, size_t y) { return batches[x] < batches[y]; });
  order.erase(std::unique(order.begin(), order.end(),
                          [&](size_t x, size_t y) { return batches[x] == batches[y]; }),
              order.end());
  if (order.size() > 3) order.erase(order.begin(), order.end() - 3);
  return order;
}

std::string faster_than_batch(const std::vector<int64_t>& batches,
                              const std::vector<const Timeline*>& timelines) {
  const std::vector<size_t> at = largest_three(batches);
  if (at.size() < 2) return "";
  size_t n = SIZE_MAX;
  for (size_t r : at) n = std::min(n, timelines[r]->events().size());
  auto faster = [&](size_t from, size_t to, size_t i) {
    const Event& x = timelines[from]->events()[i];
    const Event& y = timelines[to]->events()[i];
    return x.kind == EventKind::kAlloc && y.kind == EventKind::kAlloc && x.bytes > 0 &&
           static_cast<double>(y.bytes) * static_cast<double>(batches[from]) >
               kFasterThanBatch * static_cast<double>(x.bytes) *
                   static_cast<double>(batches[to]);
  };
  const size_t top = at.back(), below = at[at.size() - 2];
  int64_t worst = 0;
  std::string said;
  for (size_t i = 0; i < n; ++i) {
    const Event& e = timelines[top]->events()[i];
    if (e.bytes < kSmallestToJudge || e.bytes <= worst) continue;
    bool every = true;
    for (size_t k = 0; every && k + 1 < at.size(); ++k) every = faster(at[k], at[k + 1], i);
    if (!every) continue;
    worst = e.bytes;
    const std::string& op = timelines[top]->op_name(e.op);
    said = "an allocation grows faster than the batch" +
           (op.empty() ? std::string() : " (" + op + ")") + ": " +
           format_bytes(timelines[below]->events()[i].bytes) + " at batch " +
           std::to_string(batches[below]) + ", " + format_bytes(e.bytes) + " at " +
           std::to_string(batches[top]) + "; predicted as the batch squared";
  }
  return said;
}

// The curve through the live bytes at the three largest probes, where they
// rise above the line through the two smaller ones by kCurvatureToJudge or
// more at the largest: an event a batch-squared allocation is alive at.
std::optional<Curve> squared(const std::vector<std::pair<int64_t, int64_t>>& pts,
                             const std::vector<size_t>& three) {
  const double x1 = static_cast<double>(pts[three[0]].first);
  const double x2 = static_cast<double>(pts[three[1]].first);
  const double x3 = static_cast<double>(pts[three[2]].first);
  const double y1 = static_cast<double>(pts[three[0]].second);
  const double y2 = static_cast<double>(pts[three[1]].second);
  const double y3 = static_cast<double>(pts[three[2]].second);
  const double line_at_x3 = y1 + (y2 - y1) / (x2 - x1) * (x3 - x1);
  if (y3 - line_at_x3 < static_cast<double>(kCurvatureToJudge)) return std::nullopt;
  // Newton's divided differences, then the coefficients of c0 + c1 b + c2 b^2.
  const double d1 = (y2 - y1) / (x2 - x1);
  const double d2 = ((y3 - y2) / (x3 - x2) - d1) / (x3 - x1);
  Curve c;
  c.per_sample_squared = d2;
  c.per_sample = d1 - d2 * (x1 + x2);
  c.fixed = y1 - d1 * x1 + d2 * x1 * x2;
  return c;
}

}  // namespace

std::vector<Line> upper_envelope(std::vector<Line> lines) {
  std::sort(lines.begin(), lines.end(), [](const Line& a, const Line& b) {
    return a.per_sample != b.per_sample ? a.per_sample < b.per_sample
                                        : a.fixed < b.fixed;
  });
  // Same slope: only the highest matters.
  std::vector<Line> unique;
  for (const Line& l : lines) {
    if (!unique.empty() && unique.back().per_sample == l.per_sample) {
      unique.back() = l;
    } else {
      unique.push_back(l);
    }
  }
  // A line of smaller slope matters only if it is above every steeper line
  // somewhere on batch >= 1.
  std::vector<Line> hull;
  for (const Line& l : unique) {
    while (!hull.empty() && hull.back().at(1) <= l.at(1)) hull.pop_back();
    while (hull.size() >= 2 && useless(hull[hull.size() - 2], hull.back(), l)) {
      hull.pop_back();
    }
    hull.push_back(l);
  }
  return hull;
}

int64_t PhaseFit::predict(int64_t batch) const {
  if (envelope.empty() && curves.empty()) return fit.predict(batch);
  double best = 0;
  for (const Line& l : envelope) best = std::max(best, l.at(batch));
  for (const Curve& c : curves) best = std::max(best, c.at(batch));
  return ceil_bytes(best);
}

int64_t PhaseFit::max_batch_under(int64_t budget) const {
  if (predict(1) > budget) return 0;
  if (!curves.empty()) {
    // A curve bounds every batch: the largest under the budget by bisection
    // (the curves and lines grow with the batch past batch 1).
    int64_t lo = 1, hi = 2;
    while (hi < kMaxBatch && predict(hi) <= budget) lo = hi, hi = std::min(kMaxBatch, 2 * hi);
    if (predict(hi) <= budget) return kMaxBatch;
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (predict(mid) <= budget ? lo : hi) = mid;
    }
    return lo;
  }
  if (envelope.empty()) {
    return fit.per_sample <= 0 ? kMaxBatch : fit.max_batch_under(budget);
  }
  // The smallest per-line bound, then settle against predict(), which is
  // the definition.
  int64_t b = kMaxBatch;
  for (const Line& l : envelope) {
    if (l.per_sample <= 0) continue;
    const double x = (static_cast<double>(budget) - l.fixed) / l.per_sample;
    b = std::min<int64_t>(b, x >= static_cast<double>(kMaxBatch)
                                 ? kMaxBatch
                                 : std::max<int64_t>(1, static_cast<int64_t>(x)));
  }
  if (b == kMaxBatch) return kMaxBatch;
  while (b > 1 && predict(b) > budget) --b;
  while (b < kMaxBatch && predict(b + 1) <= budget) ++b;
  return b;
}

int64_t PeakModel::predict(int64_t batch) const {
  if (batch < 0 || batch > kMaxBatch) {
    // Past kMaxBatch the lines' products leave int64 (2**60 samples gave
    // 2704 B once); no real batch is that large.
    throw std::invalid_argument("[predict] batch " + std::to_string(batch) +
                                " is outside what memfit predicts: 0 to 2**40");
  }
  return peak_phase(batch).predict(batch);
}

const PhaseFit& PeakModel::peak_phase(int64_t batch) const {
  if (phases.empty()) {
    throw std::logic_error("[PeakModel] no phases were fitted");
  }
  return *std::max_element(phases.begin(), phases.end(),
                           [&](const PhaseFit& a, const PhaseFit& b) {
                             return a.predict(batch) < b.predict(batch);
                           });
}

double PeakModel::max_rel_residual() const {
  double r = 0;
  for (const auto& p : phases) r = std::max(r, p.fit.max_rel_residual);
  return r;
}

int64_t PeakModel::max_batch_under(int64_t budget) const {
  // Every phase must fit. A phase that does not grow with the batch (the
  // parameters, often the optimizer step) bounds nothing once batch 1 fits.
  int64_t best = kMaxBatch;
  for (const auto& p : phases) best = std::min(best, p.max_batch_under(budget));
  if (best == kMaxBatch) {
    double per_sample = 0;
    for (const auto& p : phases) {
      for (const Line& l : p.envelope) per_sample = std::max(per_sample, l.per_sample);
      per_sample = std::max(per_sample, p.fit.per_sample);
    }
    if (per_sample > 0) {
      // Memory grows, but the budget holds more samples than any batch.
      throw std::invalid_argument(
          "[max_batch_under] the budget " + format_bytes(budget) + " holds more than 2**40 " +
          "samples of " + format_bytes(static_cast<int64_t>(std::ceil(per_sample))) +
          " each: no real batch is that large; check the budget's units");
    }
    throw std::runtime_error(
        "[PeakModel::max_batch_under] no phase's memory grows with the batch, "
        "so every batch would fit: probe at batches far enough apart that "
        "activations show");
  }
  return best;
}

PeakModel fit_peak_model(const std::vector<int64_t>& batches,
                         const std::vector<Report>& reports,
                         const std::vector<const Timeline*>& timelines) {
  if (batches.size() != reports.size() || batches.size() < 2) {
    throw std::invalid_argument(
        "[fit_peak_model] need one report per batch and at least two batches");
  }
  if (!timelines.empty() && timelines.size() != batches.size()) {
    throw std::invalid_argument("[fit_peak_model] one timeline per batch, or none");
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
    pm.phases.push_back({first[i].name, first[i].iteration, fit_affine(points[i]), {}});
  }
  if (timelines.empty()) return pm;

  // Per-event lines, where every probe ran the same events in each phase.
  std::vector<std::vector<int64_t>> curves;
  for (const Timeline* t : timelines) curves.push_back(t->live_curve());
  bool aligned = true;
  for (const Timeline* t : timelines) {
    aligned = aligned && t->phase_spans().size() == first.size();
  }
  for (size_t p = 0; aligned && p < first.size(); ++p) {
    const auto& span0 = timelines[0]->phase_spans()[p];
    const size_t n = span0.end_event - span0.first_event;
    for (const Timeline* t : timelines) {
      const auto& span = t->phase_spans()[p];
      aligned = aligned && span.end_event - span.first_event == n;
    }
  }
  if (!aligned) {
    pm.notes.push_back(
        "the probes ran different events at different batches: each phase's "
        "peak is fitted as one line (see the residual)");
    return pm;
  }
  pm.faster_than_batch = faster_than_batch(batches, timelines);
  const std::vector<size_t> three = largest_three(batches);
  const bool curved = !pm.faster_than_batch.empty() && three.size() == 3;
  for (size_t p = 0; p < first.size(); ++p) {
    std::vector<Line> lines;
    const auto& span0 = timelines[0]->phase_spans()[p];
    const size_t n = span0.end_event - span0.first_event;
    // The level the phase starts from counts too (an empty phase is flat).
    for (size_t k = 0; k <= n; ++k) {
      std::vector<std::pair<int64_t, int64_t>> pts;
      for (size_t r = 0; r < timelines.size(); ++r) {
        const size_t first_event = timelines[r]->phase_spans()[p].first_event;
        const int64_t live = k == 0 ? (first_event == 0 ? 0 : curves[r][first_event - 1])
                                    : curves[r][first_event + k - 1];
        pts.push_back({batches[r], live});
      }
      if (curved) {
        if (auto c = squared(pts, three)) {
          pm.phases[p].curves.push_back(*c);
          continue;
        }
      }
      const AffineFit f = fit_affine(pts);
      lines.push_back(Line{f.m0, f.per_sample});
      pm.phases[p].fit.max_abs_residual =
          std::max(pm.phases[p].fit.max_abs_residual, f.max_abs_residual);
      pm.phases[p].fit.max_rel_residual =
          std::max(pm.phases[p].fit.max_rel_residual, f.max_rel_residual);
    }
    pm.phases[p].envelope = upper_envelope(std::move(lines));
  }
  return pm;
}

}  // namespace memfit
