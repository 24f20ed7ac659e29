#include "memfit/core/plan/batch_search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <unistd.h>

#include "memfit/core/model/reserve_interpolation.h"
#include "memfit/core/model/units.h"

namespace memfit {
namespace {

constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
constexpr size_t kFittedProbes = 3;  // the largest probes a model is fitted on

bool fits(const ProbeRecord& p, int64_t limit) {
  return !p.out_of_memory && p.peak_bytes <= limit;
}

// Indices of the measurements under `limit`, by batch, one per batch.
std::vector<size_t> fitting_by_batch(const ProbedModel& pm, int64_t limit) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < pm.probes.size(); ++i) {
    if (!fits(pm.probes[i], limit)) continue;
    bool seen = false;
    for (size_t j : idx) seen = seen || pm.probes[j].batch == pm.probes[i].batch;
    if (!seen) idx.push_back(i);
  }
  std::sort(idx.begin(), idx.end(),
            [&](size_t a, size_t b) { return pm.probes[a].batch < pm.probes[b].batch; });
  return idx;
}

// Refits pm.model on the largest probes under the limit; false when fewer
// than two were measured there.
bool refit(ProbedModel& pm, int64_t limit) {
  std::vector<size_t> idx = fitting_by_batch(pm, limit);
  if (idx.size() < 2) return false;
  if (idx.size() > kFittedProbes) idx.erase(idx.begin(), idx.end() - kFittedProbes);
  std::vector<int64_t> batches;
  std::vector<Report> reports;
  std::vector<const Timeline*> timelines;
  for (size_t i : idx) {
    batches.push_back(pm.probes[i].batch);
    reports.push_back(pm.measured[i].report);
    timelines.push_back(&pm.measured[i].timeline);
  }
  pm.model = fit_peak_model(batches, reports, timelines);
  return true;
}

// Measures one batch into pm, predicted first from pm's model when it has
// one; returns whether it stayed under the limit.
bool measure_into(ProbedModel& pm, const MeasureStep& measure, int64_t batch,
                  bool verification, const ProbePlan& plan, const Progress& progress) {
  ProbeRecord rec;
  rec.batch = batch;
  rec.verification = verification;
  if (!pm.model.phases.empty()) rec.predicted_bytes = pm.model.predict(batch);
  if (progress.enabled()) {
    progress.step(std::string(verification ? "verify" : "probe") + " batch " +
                  std::to_string(batch) +
                  (rec.predicted_bytes >= 0
                       ? " (predicted " + format_bytes(rec.predicted_bytes) + ")"
                       : std::string()));
  }
  StepMeasurement m = measure(batch);
  rec.out_of_memory = m.out_of_memory;
  // Held against the budget: reserved bytes on a CUDA target (a card's
  // caching allocator), else the recorded peak. The model predicts the
  // recorded (allocated) peak: its miss is measured on that.
  rec.peak_bytes = m.out_of_memory ? 0 : m.report.budget_peak();
  if (!m.out_of_memory && rec.predicted_bytes >= 0 && !verification) {
    const int64_t allocated = m.report.peak_bytes;
    const double miss = std::fabs(static_cast<double>(allocated - rec.predicted_bytes)) /
                        static_cast<double>(std::max<int64_t>(allocated, 1));
    pm.held_out_error = std::max(pm.held_out_error, miss);
    if (miss > plan.tolerance) pm.affine = false;
  }
  pm.probes.push_back(rec);
  pm.measured.push_back(std::move(m));
  return fits(rec, plan.limit_bytes);
}

int64_t smallest_over(const ProbedModel& pm, int64_t limit) {
  int64_t o = kNone;
  for (const ProbeRecord& p : pm.probes) {
    if (!fits(p, limit)) o = std::min(o, p.batch);
  }
  return o;
}

const ProbeRecord* record_at(const ProbedModel& pm, int64_t batch, int64_t limit) {
  for (const ProbeRecord& p : pm.probes) {
    if (p.batch == batch && fits(p, limit)) return &p;
  }
  return nullptr;
}

// The batch at which the line through (b1, p1) and (b2, p2) reaches `limit`;
// `fallback` when the line does not rise.
int64_t secant(int64_t b1, int64_t p1, int64_t b2, int64_t p2, int64_t limit,
               int64_t fallback) {
  if (b1 == b2 || p1 == p2) return fallback;
  const double slope = static_cast<double>(p2 - p1) / static_cast<double>(b2 - b1);
  if (slope <= 0) return fallback;
  const double b = static_cast<double>(b1) + static_cast<double>(limit - p1) / slope;
  if (!(b < static_cast<double>(kMaxBatch))) return kMaxBatch;
  return std::max<int64_t>(1, static_cast<int64_t>(std::floor(b)));
}

// The model's answer with the fit's own margin (its residual) kept free, as
// fit_batch computes it; 0 when batch 1 does not fit.
int64_t model_answer(const PeakModel& model, int64_t usable) {
  const int64_t room = usable - residual_margin(model);
  if (room < model.predict(1)) return 0;
  return model.max_batch_under(room);
}

// The step measured at `batch` (the last one that ran, out of memory or
// not): nullptr when none ran there or it ran out of memory.
const StepMeasurement* measured_at(const ProbedModel& pm, int64_t batch) {
  const StepMeasurement* m = nullptr;
  for (size_t i = 0; i < pm.probes.size(); ++i) {
    if (pm.probes[i].batch == batch) m = pm.probes[i].out_of_memory ? nullptr : &pm.measured[i];
  }
  return m;
}

RecordedStep recorded(const StepMeasurement& m, int64_t batch) {
  return RecordedStep{batch, &m.timeline, m.report.cuda ? m.report.cuda->workspace_bytes : 0};
}

// For a card: the largest batch in (best, upper] whose step, interpolated
// between the two measured steps nearest the answer, reserves at most
// `usable` (Note [A card's reserve between two steps]); best when none
// does; -1 when no two aligned steps are there to interpolate.
int64_t card_candidate(const ProbedModel& pm, int64_t below, int64_t best, int64_t lowest_bad,
                       int64_t upper, int64_t usable) {
  const StepMeasurement* at_best = measured_at(pm, best);
  const StepMeasurement* at_bad = lowest_bad == kNone ? nullptr : measured_at(pm, lowest_bad);
  const StepMeasurement* at_below = below > 0 ? measured_at(pm, below) : nullptr;
  if (at_best == nullptr || !at_best->report.cuda) return -1;
  const StepMeasurement* other = at_bad != nullptr ? at_bad : at_below;
  const int64_t other_batch = at_bad != nullptr ? lowest_bad : below;
  if (other == nullptr || !steps_align(at_best->timeline, other->timeline)) return -1;
  return largest_interpolated_under(recorded(*at_best, best), recorded(*other, other_batch),
                                    usable, best + 1, upper);
}

std::string nothing_fits(const ProbedModel& pm, const SearchOptions& o) {
  std::string why = "no probe fit";
  for (size_t i = 0; i < pm.probes.size(); ++i) {
    const ProbeRecord& p = pm.probes[i];
    if (p.batch != 1) continue;
    const Report& r = pm.measured[i].report;
    why = p.out_of_memory ? "the step at batch 1 ran out of memory"
          : r.cuda ? "the step at batch 1 reserves " + format_bytes(p.peak_bytes) +
                         " on a CUDA card (" + format_bytes(r.peak_bytes) +
                         " allocated; the caching allocator's segments hold the rest, "
                         "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True holds less)"
                   : "the step at batch 1 peaked at " + format_bytes(p.peak_bytes);
  }
  const std::string margin = o.extra_margin_bytes > 0
                                 ? " less a margin of " + format_bytes(o.extra_margin_bytes)
                                 : std::string();
  return "[fit] even one sample does not fit: " + why + ", over the budget " +
         format_bytes(o.budget_bytes) + margin +
         ". Try a bigger budget, a lighter optimizer or its state on the host, mixed "
         "precision, or activation checkpointing (memfit advise plans and measures these).";
}

// The figures of the answer: measured where a step ran at it, the model's
// otherwise.
void fill_answer(BatchFit& f, const ProbedModel& pm, int64_t usable) {
  for (size_t i = 0; i < pm.probes.size(); ++i) {
    if (pm.probes[i].batch == f.max_batch && fits(pm.probes[i], usable)) {
      f.measured_peak_bytes = pm.probes[i].peak_bytes;
      f.peak_phase = pm.measured[i].report.peak_phase;
      f.peak_iteration = pm.measured[i].report.peak_iteration;
    }
  }
  if (!pm.model.phases.empty()) {
    f.predicted_peak_bytes = pm.model.predict(f.max_batch);
    const PhaseFit& phase = pm.model.peak_phase(f.max_batch);
    if (f.peak_phase.empty()) {
      f.peak_phase = phase.phase;
      f.peak_iteration = phase.iteration;
    }
    f.bytes_per_sample = phase.fit.per_sample;
    f.fixed_bytes = phase.fit.predict(0);
  } else {
    f.predicted_peak_bytes = f.measured_peak_bytes;
  }
  f.recommended_batch = recommended_batch(f.max_batch);
  f.probes = pm.probes;
  f.held_out_error = pm.held_out_error;
  f.affine = pm.affine;
  f.notes.insert(f.notes.begin(), pm.notes.begin(), pm.notes.end());
}

}  // namespace

int64_t probe_memory_limit(const std::string& mode) {
  if (mode == "meta") return INT64_MAX;
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return int64_t{2} << 30;
  return static_cast<int64_t>(pages) * page / 8;
}

int64_t ProbedModel::largest_probe() const {
  int64_t b = 0;
  for (const ProbeRecord& p : probes) {
    if (!p.out_of_memory && !p.verification) b = std::max(b, p.batch);
  }
  return b;
}

ProbedModel probe_toward_batch(const MeasureStep& measure, int64_t batch, const ProbePlan& plan,
                               const Progress& progress) {
  if (batch < 1 || batch > kMaxBatch) {
    throw std::invalid_argument("[predict] batch " + std::to_string(batch) +
                                " is outside what memfit predicts: 1 to 2**40");
  }
  return probe_toward(measure, [batch](const PeakModel&) { return batch; }, plan, progress);
}

ProbedModel probe_toward(const MeasureStep& measure,
                         const std::function<int64_t(const PeakModel&)>& target,
                         const ProbePlan& plan, const Progress& progress) {
  if (plan.first.empty()) throw std::invalid_argument("[probe] no first probes given");
  ProbedModel pm;
  std::vector<int64_t> first = plan.first;
  std::sort(first.begin(), first.end());
  first.erase(std::unique(first.begin(), first.end()), first.end());
  if (first.front() < 1) {
    throw std::invalid_argument("[probe] probe batches must be >= 1, got " +
                                std::to_string(first.front()));
  }
  for (int64_t b : first) {
    if (!measure_into(pm, measure, b, false, plan, progress)) break;
    refit(pm, plan.limit_bytes);
  }
  if (fitting_by_batch(pm, plan.limit_bytes).size() < 2 && first.front() > 1) {
    // The smallest probe is already over: batch 1 says whether anything fits.
    measure_into(pm, measure, 1, false, plan, progress);
  }
  if (!refit(pm, plan.limit_bytes)) return pm;

  // First probes already off their line (a small batch that runs other
  // kernels) are grown past, as a probe off the line is.
  bool last_check_ok = pm.affine;
  for (;;) {
    const int64_t want = target(pm.model);
    const int64_t largest = pm.largest_probe();
    const int64_t over = smallest_over(pm, plan.limit_bytes);
    if (largest * 8 >= want && last_check_ok) break;
    if (largest * 2 >= want) break;  // the next probe would be the answer itself
    const int64_t next = largest * 2;
    if (next >= over || next > kMaxBatch) break;
    // A probe predicted past the limit would not fit (or would take the
    // machine's memory): stop, and the prediction says it extrapolates.
    if (pm.model.predict(next) > plan.limit_bytes) break;
    const bool under = measure_into(pm, measure, next, false, plan, progress);
    // The model predicts allocated bytes: checked on those (a card's
    // reserve is the probe's peak_bytes).
    const ProbeRecord& got = pm.probes.back();
    const int64_t allocated = got.out_of_memory ? 0 : pm.measured.back().report.peak_bytes;
    last_check_ok = got.out_of_memory ||
                    std::fabs(static_cast<double>(allocated - got.predicted_bytes)) <=
                        plan.tolerance * static_cast<double>(allocated);
    refit(pm, plan.limit_bytes);
    if (!under) break;
  }
  if (!pm.affine) {
    pm.notes.push_back("the step is not affine in the batch over the probes: a probe was " +
                       format_percent(pm.held_out_error) +
                       " off the line of the smaller ones (kernels change path with the "
                       "batch and the thread count); the model is fitted on the largest "
                       "probes");
  }
  return pm;
}

PredictionCertainty certainty_at(const ProbedModel& probed, int64_t batch) {
  PredictionCertainty c;
  c.batch = batch;
  c.predicted_bytes = probed.model.predict(batch);
  c.probes = probed.model.probe_batches;
  c.held_out_error = probed.held_out_error;
  // See Note [An allocation that grows faster than the batch] (peak_model.cpp).
  c.affine = probed.affine && probed.model.faster_than_batch.empty();
  c.faster_than_batch = probed.model.faster_than_batch;
  c.beyond_probes = c.probes.empty() || batch > *std::max_element(c.probes.begin(), c.probes.end());
  // The two largest probes that ran, for a card's reserve.
  int64_t b1 = 0, b2 = 0;
  for (const ProbeRecord& p : probed.probes) {
    if (p.out_of_memory || p.verification || p.batch == b1 || p.batch == b2) continue;
    if (p.batch > b1) {
      b2 = b1;
      b1 = p.batch;
    } else if (p.batch > b2) {
      b2 = p.batch;
    }
  }
  const StepMeasurement* m1 = b1 > 0 ? measured_at(probed, b1) : nullptr;
  const StepMeasurement* m2 = b2 > 0 ? measured_at(probed, b2) : nullptr;
  if (m1 != nullptr && m2 != nullptr && m1->report.cuda && m2->report.cuda &&
      steps_align(m1->timeline, m2->timeline)) {
    c.predicted_reserved_bytes =
        interpolated_budget_peak(recorded(*m2, b2), recorded(*m1, b1), batch);
  }
  return c;
}

std::string PredictionCertainty::text() const {
  std::string probes_text, notes_text;
  for (int64_t b : probes) probes_text += (probes_text.empty() ? "" : ", ") + std::to_string(b);
  for (const std::string& n : notes) notes_text += "; " + n;
  return "predicted " + format_bytes(predicted_bytes) + " at batch " + std::to_string(batch) +
         " from probes at " + probes_text + "; worst held-out miss " + format_percent(held_out_error) +
         (affine ? "" : ", not affine") +
         (faster_than_batch.empty() ? "" : " (" + faster_than_batch + ")") +
         (beyond_probes ? "; extrapolated beyond the largest probe" : "") +
         (predicted_reserved_bytes >= 0
              ? "; a card would reserve " + format_bytes(predicted_reserved_bytes) +
                    " (the caching allocator replayed on the step sized from the two largest "
                    "probes)"
              : std::string()) +
         notes_text;
}

namespace {

// The search of Note [Verifying the answer], from the probes' answer: the
// largest batch measured to fit (best) and the one below it, the smallest
// that did not (lowest_bad), with their peaks (-1: ran out of memory, peak
// unknown). Each full-size step moves one end of that bracket.
class Verification {
 public:
  Verification(ProbedModel& pm, const MeasureStep& measure, const ProbePlan& plan,
               const SearchOptions& o, int64_t usable, bool card, int64_t best)
      : pm_(pm), measure_(measure), plan_(plan), o_(o), usable_(usable), card_(card),
        best_(best), lowest_bad_(smallest_over(pm, usable)) {
    for (const ProbeRecord& p : pm.probes) {
      if (fits(p, usable) && p.batch < best && p.batch > below_) {
        below_ = p.batch;
        below_peak_ = p.peak_bytes;
      }
      if (p.batch == lowest_bad_ && !p.out_of_memory) bad_peak_ = p.peak_bytes;
    }
    best_peak_ = record_at(pm, best, usable)->peak_bytes;
  }

  // Full-size steps from `candidate` (the model's answer) while they may
  // find more batch; returns the largest batch measured to fit.
  int64_t run(int64_t candidate, BatchFit& f) {
    // A card's candidates: between two measured steps (the whole bracket
    // below the smallest failure), or past them up to twice the answer so
    // far, replayed; see Note [A card's reserve between two steps]. The
    // allocated model's answer is under what a card reserves and would land
    // over the card.
    const int64_t card_first = card_ ? card_next(candidate) : -1;
    if (card_first >= 0) candidate = card_first;
    card_bracketed_ = card_first >= 0 && lowest_bad_ != kNone;
    while (f.trials < o_.max_trials && candidate > best_) {
      if (past_host(candidate, f)) break;
      ++f.trials;
      candidate = std::min({next_after(step_at(candidate)), lowest_bad_ - 1, o_.max_batch});
      // A full-size step costs more than all the probes together: another
      // is worth it only for 2% more batch (the goal: >= 98% of the true
      // maximum with one full-size step).
      if ((candidate - best_) * 50 < best_) break;
    }
    return best_;
  }

 private:
  // No step predicted above the host's limit runs: the answer stays the
  // largest measured, and the notes say why.
  bool past_host(int64_t candidate, BatchFit& f) const {
    if (pm_.model.phases.empty() || pm_.model.predict(candidate) <= o_.host_limit_bytes)
      return false;
    f.notes.push_back("batch " + std::to_string(candidate) + " would take " +
                      format_bytes(pm_.model.predict(candidate)) +
                      ", more than this machine lets a step take (" +
                      format_bytes(o_.host_limit_bytes) +
                      "): the answer is the largest batch measured, " + std::to_string(best_) +
                      "; run on the device, or pass verify off for the model's answer");
    return true;
  }

  // Runs a whole step at `candidate` and moves the bracket; whether it fit.
  bool step_at(int64_t candidate) {
    measure_into(pm_, measure_, candidate, true, plan_, o_.progress);
    const ProbeRecord& tried = pm_.probes.back();
    const bool ok = fits(tried, usable_);
    if (ok) {
      below_ = best_;
      below_peak_ = best_peak_;
      best_ = candidate;
      best_peak_ = tried.peak_bytes;
    } else {
      lowest_bad_ = candidate;
      const int64_t before = bad_peak_;
      bad_peak_ = tried.out_of_memory ? -1 : tried.peak_bytes;
      // A card's last two failures measured the same reserve (one stair).
      flat_failure_ = card_ && bad_peak_ >= 0 && bad_peak_ == before;
    }
    return ok;
  }

  // Next: inside the bracket, by the secant through its ends; above it, by
  // the secant through the two largest that fit. An OOM gives no peak: the
  // first steps back by the model's own error (it was close), the second
  // bisects. A card's replay comes first while it holds.
  int64_t next_after(bool ok) {
    const int64_t half = lowest_bad_ == kNone ? 2 * best_ : best_ + (lowest_bad_ - best_) / 2;
    const int64_t up = secant(below_, below_peak_, best_, best_peak_, usable_, best_);
    // A candidate interpolated inside a bracket that does not fit: the
    // steps' sizes are not on a line there; the secant takes over.
    if (!ok && card_bracketed_) card_trusted_ = false;
    const int64_t card = card_ && card_trusted_ ? card_next(best_) : -1;
    card_bracketed_ = card >= 0 && lowest_bad_ != kNone;
    if (card >= 0) return card;
    if (lowest_bad_ == kNone) return up;
    // A card's reserve is a staircase in the batch (segments): two failures
    // on one stair send a secant creeping along it. Bisect.
    if (flat_failure_) return half;
    if (bad_peak_ >= 0) return secant(best_, best_peak_, lowest_bad_, bad_peak_, usable_, half);
    if (!ok && ++blind_misses_ == 1) {
      const double back = std::max(0.02, 4 * pm_.held_out_error);
      return best_ + static_cast<int64_t>(static_cast<double>(lowest_bad_ - best_) * (1 - back));
    }
    return ok ? std::min(up, lowest_bad_ - 1) : half;
  }

  // A card's candidate from the replay between the measured steps, up to
  // the bracket's top or twice the answer so far.
  int64_t card_next(int64_t from) const {
    const int64_t upper = lowest_bad_ != kNone
                              ? std::min(lowest_bad_ - 1, o_.max_batch)
                              : std::min(o_.max_batch, 2 * std::max(best_, from));
    return card_candidate(pm_, below_, best_, lowest_bad_, upper, usable_);
  }

  ProbedModel& pm_;
  const MeasureStep& measure_;
  const ProbePlan& plan_;
  const SearchOptions& o_;
  const int64_t usable_;
  const bool card_;  // for a CUDA card: candidates from the caching allocator's replay
  int64_t best_ = 0, best_peak_ = 0;
  int64_t below_ = 0, below_peak_ = 0;
  int64_t lowest_bad_ = kNone, bad_peak_ = -1;
  int blind_misses_ = 0;  // candidates that ran out of memory, peak unknown
  bool flat_failure_ = false;
  bool card_trusted_ = true;
  bool card_bracketed_ = false;  // the next candidate is a card's, inside the bracket
};

void check(const SearchOptions& options) {
  if (options.max_batch < 1) {
    throw std::invalid_argument("[search_batch] max_batch must be >= 1, got " +
                                std::to_string(options.max_batch) +
                                ": pass the largest batch wanted");
  }
  if (options.budget_bytes < 0 || options.extra_margin_bytes < 0) {
    throw std::invalid_argument("[fit] the budget and the margin must be >= 0 bytes");
  }
  if (options.verify && options.max_trials < 1) {
    throw std::invalid_argument("[fit] verification needs max_trials >= 1");
  }
  const int64_t usable = options.budget_bytes - options.extra_margin_bytes;
  if (options.budget_bytes == 0) {
    throw std::invalid_argument(
        "[fit] the budget is 0 B: no step fits in it; give the memory the step may use");
  }
  if (usable <= 0) {
    throw std::invalid_argument("[fit] the margin " + format_bytes(options.extra_margin_bytes) +
                                " leaves nothing of the budget " +
                                format_bytes(options.budget_bytes) +
                                ": give a margin smaller than the budget");
  }
}

// When no probe fits: the steps that ran (over the budget) still say what
// fills memory; the model of them gives fit_batch's message, with the
// numbers and advice. Else the search's own message.
[[noreturn]] void raise_nothing_fits(const ProbedModel& pm, const SearchOptions& options) {
  std::vector<int64_t> batches;
  std::vector<Report> reports;
  std::vector<const Timeline*> timelines;
  for (size_t i = 0; i < pm.probes.size(); ++i) {
    if (pm.probes[i].out_of_memory) continue;
    batches.push_back(pm.probes[i].batch);
    reports.push_back(pm.measured[i].report);
    timelines.push_back(&pm.measured[i].timeline);
  }
  // The model's message counts allocated bytes: not a card's reserve.
  if (batches.size() >= 2 && !reports.front().cuda) {
    const PeakModel over = fit_peak_model(batches, reports, timelines);
    fit_batch(over, reports.front(), options.budget_bytes, options.extra_margin_bytes);
  }
  throw DoesNotFit(nothing_fits(pm, options));
}

// The model's answer for a card without a verifying step: the model
// predicts allocated bytes and a card reserves more, so the gap the largest
// probe measured is kept free (the gap grows with the batch: a guess, said
// so).
int64_t unverified_card_answer(const ProbedModel& pm, int64_t candidate, int64_t best,
                               int64_t usable, BatchFit& f) {
  int64_t gap = 0, largest = 0;
  for (size_t i = 0; i < pm.probes.size(); ++i) {
    if (pm.probes[i].out_of_memory || pm.probes[i].batch <= largest) continue;
    largest = pm.probes[i].batch;
    gap = pm.probes[i].peak_bytes - pm.measured[i].report.peak_bytes;
  }
  const int64_t room = usable - gap;
  if (room >= pm.model.predict(1)) {
    candidate = std::max(best, std::min(candidate, pm.model.max_batch_under(room)));
  }
  f.notes.push_back("unverified for a CUDA card: the model predicts allocated bytes, and "
                    "the caching allocator reserves more (" + format_bytes(gap) +
                    " more at the largest probe, kept free); verify on, or leave a margin");
  return candidate;
}

}  // namespace

BatchFit search_batch(const MeasureStep& measure, const SearchOptions& given) {
  check(given);
  SearchOptions options = given;
  options.max_batch = std::min(options.max_batch, kMaxBatch);
  const int64_t usable = options.budget_bytes - options.extra_margin_bytes;
  ProbePlan plan = options.probes;
  plan.limit_bytes = std::min(usable, options.host_limit_bytes);
  // Probes grow toward the model's answer; an error in it (memory that does
  // not grow) stops growth here and is raised by fit_batch below.
  auto target = [&](const PeakModel& model) -> int64_t {
    try {
      return std::min(model_answer(model, usable), options.max_batch);
    } catch (const std::exception&) {
      return 0;
    }
  };
  ProbedModel pm = probe_toward(measure, target, plan, options.progress);

  // The largest batch measured under the limit, no larger than max_batch:
  // a probe above it (max_batch: a smaller batch another rank runs, a
  // Trainer's whole batch) is not an answer. Where only such probes fit,
  // max_batch itself is measured: it was answered unasked before (8 where
  // another rank could run 2, and the ranks never agreed).
  auto best_under_cap = [&] {
    int64_t b = 0;
    for (const ProbeRecord& p : pm.probes) {
      if (fits(p, usable) && p.batch <= options.max_batch) b = std::max(b, p.batch);
    }
    return b;
  };
  int64_t best = best_under_cap();
  const bool cap_measured =
      best == 0 && std::any_of(pm.probes.begin(), pm.probes.end(),
                               [&](const ProbeRecord& p) { return fits(p, usable); });
  if (cap_measured) {
    measure_into(pm, measure, options.max_batch, true, plan, options.progress);
    best = best_under_cap();
  }
  const Report* reference = nullptr;  // after the last measurement: pm.measured may move
  for (size_t i = 0; i < pm.probes.size() && reference == nullptr; ++i) {
    if (!pm.probes[i].out_of_memory) reference = &pm.measured[i].report;
  }
  if (best == 0) raise_nothing_fits(pm, options);

  BatchFit f;
  if (cap_measured) f.trials = 1;
  f.budget_bytes = options.budget_bytes;
  f.mode = reference->mode;
  if (reference->cuda) {
    f.notes.push_back("for a CUDA card: each step's peak held against the budget is the "
                      "caching allocator's reserved bytes, replayed on it (measured_peak_bytes); "
                      "predicted_peak_bytes is the model's allocated bytes");
    // Note [Scratch the CPU does not see]
    // Measured on an H200 (torch 2.11, bench/gpu/fit_on_card.py, capped at
    // the budget): with the cuBLAS workspaces counted, 7 of 8 fits ran; the
    // MLP fit for 256 MiB (batch 14712) ran out asking 58 MiB, the CUDA
    // reduction's staging buffer of its bias gradients, which memfit counts (Note
    // [A CUDA reduction's staging buffer], card_kernels.cpp). The CNN's fits
    // ran capped although free, cuDNN took 2.3x the budget: its workspaces
    // shrink to what is free. That one is not modelled, so the answer says so.
    f.notes.push_back("not counted for a CUDA card: cuDNN convolutions' workspaces, which "
                      "they take from free memory and fall back to less when it is short "
                      "(a reduction's staging buffer is counted). Keep margin= free for "
                      "them, or run one step on the card");
  }
  int64_t candidate = best;
  if (!pm.model.phases.empty()) {
    try {
      const BatchFit model_fit =
          fit_batch(pm.model, *reference, options.budget_bytes, options.extra_margin_bytes);
      candidate = std::max(best, model_fit.max_batch);
      f.margin_bytes = model_fit.margin_bytes;
    } catch (const DoesNotFit&) {
      // A measured batch fits although the model says none does: trust the
      // measurement.
    }
  }
  candidate = std::min({candidate, smallest_over(pm, usable) - 1, options.max_batch});

  if (options.verify) {
    f.margin_bytes = options.extra_margin_bytes;
    Verification v(pm, measure, plan, options, usable, reference->cuda.has_value(), best);
    f.max_batch = v.run(candidate, f);
    f.verified = f.mode != "meta";
    if (!f.verified) {
      f.notes.push_back(
          "measured on the meta device: the sizes are exact, but no kernel ran (no "
          "workspace, no allocator): unverified");
    } else if (f.trials == 0) {
      // Verified, yet no full-size step ran: the answer's own step was one
      // of the probes (the example batch's, recorded by profile()).
      f.notes.push_back("verified by a step already recorded: batch " + std::to_string(best) +
                        " was measured as a probe (the example batch's own step when that is "
                        "its size) and fits, and no larger batch is predicted to: no further "
                        "full-size step ran (trials=0)");
    }
  } else {
    if (reference->cuda && !pm.model.phases.empty() && record_at(pm, candidate, usable) == nullptr) {
      candidate = unverified_card_answer(pm, candidate, best, usable, f);
    }
    f.max_batch = candidate;
    if (record_at(pm, candidate, usable) == nullptr) {
      f.notes.push_back("unverified: no step ran at batch " + std::to_string(candidate) +
                        "; the answer is the model's");
    }
  }
  fill_answer(f, pm, usable);
  return f;
}

}  // namespace memfit
