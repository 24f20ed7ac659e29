#include "memfit/core/plan/batch_search.h"
#include "memfit/core/render/fit_text.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "step_writer.h"

namespace memfit {
namespace {

constexpr int64_t kParams = 1 << 20;

// A recorded step whose activations take act(b) bytes at batch b:
// parameters, then two iterations of forward (activations), backward
// (gradients; activations freed), optimizer_step (Adam-like state in the
// first) and zero_grad.
// square: a second activation of square(b) bytes beside it (a batch x batch
// similarity matrix), freed with it; none where null.
Timeline step_timeline(int64_t b, const std::function<int64_t(int64_t)>& act,
                       const std::function<int64_t(int64_t)>& square = nullptr) {
  Timeline t;
  testing::StepWriter step(t);
  t.begin_phase("parameters", 1);
  step.alloc(kParams, Category::kParameter);
  for (int it = 1; it <= 2; ++it) {
    t.begin_phase("inputs", it);
    const uint64_t x = step.alloc(64 * b, Category::kInput);
    t.begin_phase("forward", it);
    const uint64_t a = step.alloc(act(b), Category::kActivation);
    const uint64_t sq = square ? step.alloc(square(b), Category::kActivation) : 0;
    t.begin_phase("backward", it);
    const uint64_t g = step.alloc(kParams, Category::kGradient);
    if (square) step.free(sq);
    step.free(a);
    step.free(x);
    t.begin_phase("optimizer_step", it);
    if (it == 1) step.alloc(2 * kParams, Category::kOptimizerState);
    t.begin_phase("zero_grad", it);
    step.free(g);
  }
  t.end_phase();
  return t;
}

struct Step {
  std::function<int64_t(int64_t)> act;
  int64_t enforced_budget = -1;  // raise OOM above it, as a simulated device does
  std::vector<int64_t> measured = {};
  std::function<int64_t(int64_t)> square = nullptr;  // step_timeline's

  int64_t peak(int64_t b) const {
    return make_report(step_timeline(b, act, square), {"synthetic", b, "adam", "cpu"})
        .peak_bytes;
  }
  MeasureStep measure() {
    return [this](int64_t b) {
      measured.push_back(b);
      StepMeasurement m;
      m.timeline = step_timeline(b, act, square);
      m.report = make_report(m.timeline, {"synthetic", b, "adam", "cpu"});
      if (enforced_budget >= 0 && m.report.peak_bytes > enforced_budget) {
        m = StepMeasurement{};
        m.out_of_memory = true;
      }
      return m;
    };
  }
  // The true answer, by scanning: the largest b whose peak fits.
  int64_t true_max(int64_t budget) const {
    int64_t lo = 0, hi = 1;
    while (peak(hi) <= budget) hi *= 2;
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (peak(mid) <= budget ? lo : hi) = mid;
    }
    return lo;
  }
};

SearchOptions budget_of(int64_t bytes) {
  SearchOptions o;
  o.budget_bytes = bytes;
  return o;
}

TEST(BatchSearch, AffineStepIsFoundExactlyAndVerifiedOnce) {
  Step s{[](int64_t b) { return 4096 * b; }};
  const int64_t budget = 64 << 20;
  const BatchFit f = search_batch(s.measure(), budget_of(budget));
  EXPECT_EQ(f.max_batch, s.true_max(budget));
  EXPECT_TRUE(f.verified);
  EXPECT_TRUE(f.affine);
  EXPECT_EQ(f.trials, 1);
  EXPECT_EQ(f.measured_peak_bytes, s.peak(f.max_batch));
  EXPECT_LE(f.measured_peak_bytes, budget);
  // The probes cost under one step at the answer: under half its samples,
  // at two iterations each.
  int64_t probe_samples = 0;
  for (const ProbeRecord& p : f.probes) probe_samples += p.verification ? 0 : p.batch;
  EXPECT_LT(probe_samples, f.max_batch / 2);
}

TEST(BatchSearch, NoAnswerIsAboveMaxBatchEvenWhereLargerProbesFit) {
  // Another rank runs only 3 (or a Trainer's whole batch is 3): probes at
  // 8, 16 and 32 fit, and the answer is 3, measured. It was 32 before, and
  // the ranks never agreed on a batch.
  Step s{[](int64_t b) { return 4096 * b; }};
  SearchOptions o = budget_of(64 << 20);
  o.probes.first = {8, 16, 32};
  o.max_batch = 3;
  const BatchFit f = search_batch(s.measure(), o);
  EXPECT_EQ(f.max_batch, 3);
  EXPECT_TRUE(f.verified);
  EXPECT_EQ(f.trials, 1);
  EXPECT_EQ(f.measured_peak_bytes, s.peak(3));
  EXPECT_EQ(s.measured.back(), 3);
}

TEST(BatchSearch, AnAnswerAProbeMeasuredIsVerifiedWithoutAStepAndSaysSo) {
  // A budget that the probe at 32 exactly fills: that probe is the answer,
  // and no further full-size step runs; the answer says why it is verified
  // with trials=0.
  Step s{[](int64_t b) { return 4096 * b; }};
  SearchOptions o = budget_of(s.peak(32));
  o.probes.first = {8, 16, 32};
  const BatchFit f = search_batch(s.measure(), o);
  EXPECT_EQ(f.max_batch, 32);
  EXPECT_TRUE(f.verified);
  EXPECT_EQ(f.trials, 0);
  bool said = false;
  for (const auto& n : f.notes) {
    said = said || n.find("verified by a step already recorded: batch 32 was measured as a "
                          "probe") == 0;
  }
  EXPECT_TRUE(said) << (f.notes.empty() ? "no notes" : f.notes.front());
}

TEST(BatchSearch, AZeroBudgetIsNamedNotTheMargin) {
  Step s{[](int64_t b) { return 4096 * b; }};
  try {
    search_batch(s.measure(), budget_of(0));
    FAIL() << "expected invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).find("[fit] the budget is 0 B"), 0u) << e.what();
  }
}

TEST(BatchSearch, PerSampleMemoryThatJumpsWithTheBatchNeverOvershoots) {
  // As the CPU kernels of a GroupNorm/SiLU net: ~600 B a sample at small
  // batches, ~790 B from 16 up (scaled up here).
  Step s{[](int64_t b) { return b < 16 ? 6000 * b : 7900 * b + 20000; }};
  const int64_t budget = 8 << 20;
  const BatchFit f = search_batch(s.measure(), budget_of(budget));
  const int64_t truth = s.true_max(budget);
  EXPECT_LE(f.max_batch, truth);
  EXPECT_GE(f.max_batch * 100, truth * 98);
  EXPECT_FALSE(f.affine);
  EXPECT_GT(f.held_out_error, 0.005);
  ASSERT_FALSE(f.notes.empty());
  EXPECT_NE(f.notes.front().find("not affine"), std::string::npos) << f.notes.front();
}

TEST(BatchSearch, EnforcedBudgetOutOfMemoryStepsDownToAMeasuredBatch) {
  // Convex growth: a line from small probes under-predicts, so the first
  // candidate runs out of memory on the simulated device.
  Step s{[](int64_t b) { return 3000 * b + b * b * 40; }};
  const int64_t budget = 8 << 20;
  s.enforced_budget = budget;
  const BatchFit f = search_batch(s.measure(), budget_of(budget));
  const int64_t truth = s.true_max(budget);
  EXPECT_LE(f.max_batch, truth);
  EXPECT_GE(f.max_batch * 100, truth * 95);
  EXPECT_TRUE(f.verified);
  EXPECT_LE(f.trials, SearchOptions{}.max_trials);
  EXPECT_LE(s.peak(f.max_batch), budget);
}

// Runs the search on 60 random piecewise-affine steps; odd runs enforce the
// budget (an OOM says no more than "over"), even ones report every peak.
// Returns the mean of found / true per kind.
std::pair<double, double> random_curves(bool* overshot) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  double sum[2] = {0, 0};
  const int runs = 60;
  for (int run = 0; run < runs; ++run) {
    // Piecewise affine, as kernels that change path at a batch make it,
    // with a curvature of up to 5% at the budget on top.
    const int64_t budget = (4 << 20) + static_cast<int64_t>(u(rng) * (60 << 20));
    const double slope = 1000 + 9000 * u(rng);
    const double scale = static_cast<double>(budget) / slope;  // ~ the answer
    const double curve = (u(rng) - 0.5) * 0.1 / scale;
    const int64_t kink = 4 + static_cast<int64_t>(200 * u(rng));
    const double jump = 0.4 * u(rng);
    Step s{[=](int64_t b) {
      const double x = static_cast<double>(b);
      double bytes = slope * x * (1 + curve * x);
      if (b >= kink) bytes += jump * slope * x + 5000;
      return static_cast<int64_t>(bytes);
    }};
    const bool blind = run % 2 == 1;
    if (blind) s.enforced_budget = budget;
    const BatchFit f = search_batch(s.measure(), budget_of(budget));
    const int64_t truth = s.true_max(budget);
    if (f.max_batch > truth || s.peak(f.max_batch) > budget) *overshot = true;
    sum[blind] += static_cast<double>(f.max_batch) / static_cast<double>(truth);
  }
  return {sum[0] / (runs / 2), sum[1] / (runs / 2)};
}

TEST(BatchSearch, NoStepAboveTheBudgetOnRandomCurves) {
  bool overshot = false;
  const auto [measured, blind] = random_curves(&overshot);
  EXPECT_FALSE(overshot);
  EXPECT_GE(measured, 0.98);  // every peak measured: the secant is exact
  EXPECT_GE(blind, 0.95);     // an OOM says only "over": bisection
}

TEST(BatchSearch, OnlyOneSampleFits) {
  Step s{[](int64_t b) { return 3 * kParams * b; }};
  const int64_t budget = s.peak(1) + 10;
  const BatchFit f = search_batch(s.measure(), budget_of(budget));
  EXPECT_EQ(f.max_batch, 1);
  EXPECT_EQ(f.measured_peak_bytes, s.peak(1));
}

TEST(BatchSearch, NothingFitsSaysBatchOne) {
  Step s{[](int64_t b) { return 4096 * b; }};
  s.enforced_budget = 1 << 20;
  try {
    search_batch(s.measure(), budget_of(1 << 20));
    FAIL() << "expected DoesNotFit";
  } catch (const DoesNotFit& e) {
    EXPECT_NE(std::string(e.what()).find("even one sample does not fit: the step at batch 1 ran "
                                         "out of memory"),
              std::string::npos)
        << e.what();
  }
}

TEST(BatchSearch, WithoutVerifyTheAnswerIsTheModelsAndSaysSo) {
  Step s{[](int64_t b) { return 4096 * b; }};
  SearchOptions o = budget_of(64 << 20);
  o.verify = false;
  const BatchFit f = search_batch(s.measure(), o);
  EXPECT_FALSE(f.verified);
  EXPECT_EQ(f.trials, 0);
  EXPECT_EQ(f.max_batch, s.true_max(64 << 20));  // affine: the model is exact
  EXPECT_NE(to_json(f, false).find("\"verified\":false"), std::string::npos);
  ASSERT_FALSE(f.notes.empty());
  EXPECT_NE(f.notes.back().find("unverified"), std::string::npos);
}

TEST(BatchSearch, MarginIsKeptFreeByTheMeasuredPeak) {
  Step s{[](int64_t b) { return 4096 * b; }};
  SearchOptions o = budget_of(64 << 20);
  o.extra_margin_bytes = 8 << 20;
  const BatchFit f = search_batch(s.measure(), o);
  EXPECT_EQ(f.max_batch, s.true_max(56 << 20));
  EXPECT_EQ(f.margin_bytes, 8 << 20);
}

TEST(BatchSearch, StopsAtTheLargestBatchWanted) {
  Step s{[](int64_t b) { return 4096 * b; }};
  SearchOptions o = budget_of(64 << 20);
  o.max_batch = 100;
  const BatchFit f = search_batch(s.measure(), o);
  EXPECT_EQ(f.max_batch, 100);
  EXPECT_TRUE(f.verified);
  for (int64_t b : s.measured) EXPECT_LE(b, 100);
}

// The front passes the user's numbers as they are: the core checks them.
TEST(BatchSearch, ALargestBatchBelowOneIsRefusedAndOneAbove2To40IsCapped) {
  Step s{[](int64_t b) { return 4096 * b; }};
  SearchOptions o = budget_of(64 << 20);
  o.max_batch = 0;
  try {
    search_batch(s.measure(), o);
    FAIL() << "expected invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).find("[search_batch] max_batch must be >= 1, got 0"), 0u)
        << e.what();
  }
  EXPECT_TRUE(s.measured.empty());
  o.max_batch = INT64_MAX;
  EXPECT_EQ(search_batch(s.measure(), o).max_batch, s.true_max(64 << 20));
}

TEST(BatchSearch, APredictionOutside1To2To40IsRefusedBeforeAnyProbe) {
  Step s{[](int64_t b) { return 4096 * b; }};
  for (int64_t batch : {int64_t{0}, kMaxBatch + 1}) {
    try {
      probe_toward_batch(s.measure(), batch, ProbePlan{});
      FAIL() << "expected invalid_argument for " << batch;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("outside what memfit predicts"), std::string::npos);
    }
  }
  EXPECT_TRUE(s.measured.empty());
  const ProbedModel pm = probe_toward_batch(s.measure(), 64, ProbePlan{});
  EXPECT_GE(pm.probes.size(), 2u);
}

TEST(BatchSearch, SaysEachProbeAndVerificationBeforeItRuns) {
  // Affine, and curved (the model's first answer misses: more verifications).
  for (const auto& act : std::vector<std::function<int64_t(int64_t)>>{
           [](int64_t b) { return 4096 * b; },
           [](int64_t b) { return 4096 * b + 64 * b * b; }}) {
    Step s{act};
    SearchOptions o = budget_of(64 << 20);
    std::vector<std::string> lines;
    std::vector<size_t> measured_before;  // steps run when each line came
    o.progress = Progress([&](const std::string& line) {
      lines.push_back(line);
      measured_before.push_back(s.measured.size());
    });
    const BatchFit f = search_batch(s.measure(), o);
    ASSERT_EQ(lines.size(), f.probes.size());
    for (size_t i = 0; i < lines.size(); ++i) {
      const ProbeRecord& p = f.probes[i];
      const std::string what = std::string(p.verification ? "] verify" : "] probe") +
                               " batch " + std::to_string(p.batch);
      EXPECT_EQ(lines[i].rfind("[", 0), 0u) << lines[i];  // the elapsed seconds
      EXPECT_NE(lines[i].find(what), std::string::npos) << lines[i] << " vs " << what;
      EXPECT_EQ(lines[i].find("predicted") != std::string::npos, p.predicted_bytes >= 0)
          << lines[i];
      EXPECT_EQ(measured_before[i], i) << "said after the step ran: " << lines[i];
    }
    EXPECT_GE(f.trials, 1);
  }
}

TEST(ProbeToward, SaysEachProbe) {
  Step s{[](int64_t b) { return 4096 * b; }};
  std::vector<std::string> lines;
  const ProbedModel pm = probe_toward(
      s.measure(), [](const PeakModel&) { return 256; }, ProbePlan(),
      Progress([&](const std::string& line) { lines.push_back(line); }));
  ASSERT_EQ(lines.size(), pm.probes.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_NE(lines[i].find("] probe batch " + std::to_string(pm.probes[i].batch)),
              std::string::npos)
        << lines[i];
  }
}

TEST(ProbeToward, PredictionSaysWhenItExtrapolates) {
  Step s{[](int64_t b) { return 4096 * b; }};
  ProbePlan plan;
  const ProbedModel pm = probe_toward(s.measure(), [](const PeakModel&) { return 256; }, plan);
  EXPECT_GE(pm.largest_probe() * 8, 256);
  const PredictionCertainty c = certainty_at(pm, 256);
  EXPECT_EQ(c.predicted_bytes, s.peak(256));
  EXPECT_TRUE(c.beyond_probes);
  EXPECT_TRUE(c.affine);
  EXPECT_NE(c.text().find("extrapolated beyond the largest probe"), std::string::npos);
}

TEST(ProbeToward, PredictionSaysTheNotesOfTheReportThatAsked) {
  Step s{[](int64_t b) { return 4096 * b; }};
  const ProbedModel pm = probe_toward(s.measure(), [](const PeakModel&) { return 64; }, {});
  PredictionCertainty c = certainty_at(pm, 64);
  EXPECT_TRUE(c.notes.empty());
  const std::string plain = c.text();
  c.notes = {"the line missed batch 7", "a workspace left out"};
  EXPECT_EQ(c.text(), plain + "; the line missed batch 7; a workspace left out");
}

TEST(ProbeToward, ABatchSquaredAllocationIsNamedAndPredictedAsACurve) {
  // See Note [An allocation that grows faster than the batch]: 4 b^2 bytes
  // are 4 KiB at batch 32, nothing beside 1 MiB of weights, and lines
  // through the probes missed the step at 1024 by most of its 4 MiB.
  Step s{[](int64_t b) { return 4096 * b; }};
  s.square = [](int64_t b) { return 4 * b * b; };
  const ProbedModel pm = probe_toward(s.measure(), [](const PeakModel&) { return 1024; },
                                      ProbePlan{});
  const PredictionCertainty c = certainty_at(pm, 1024);
  EXPECT_EQ(c.predicted_bytes, s.peak(1024));
  EXPECT_FALSE(c.affine);
  EXPECT_NE(c.faster_than_batch.find("an allocation grows faster than the batch"),
            std::string::npos)
      << c.faster_than_batch;
  EXPECT_NE(c.text().find("predicted as the batch squared"), std::string::npos);
  // The model answers a budget as a curve: the largest batch whose peak fits.
  const int64_t budget = s.peak(1500);
  EXPECT_EQ(pm.model.max_batch_under(budget), s.true_max(budget));
}

TEST(ProbeToward, FirstProbesOffTheirLineAreGrownPast) {
  // Batch 1 runs other kernels (a CNN with BatchNorm on the CPU): 6 MiB
  // where the line of the larger batches gives 2 MiB. The first probes
  // 1, 2, 4 disagree, and stopping there (4 x 8 >= 24) predicted 24 off
  // that line; probes grown past them give the larger batches' line.
  Step s{[](int64_t b) { return b == 1 ? int64_t{6} << 20 : (int64_t{2} << 20) * b; }};
  ProbePlan plan;
  plan.first = {1, 2, 4};
  const ProbedModel pm = probe_toward(s.measure(), [](const PeakModel&) { return 24; }, plan);
  EXPECT_GE(pm.largest_probe(), 8);
  EXPECT_EQ(certainty_at(pm, 24).predicted_bytes, s.peak(24));
}

TEST(ProbeToward, LinearAllocationsKeepTheirLines) {
  Step s{[](int64_t b) { return 4096 * b; }};
  const ProbedModel pm = probe_toward(s.measure(), [](const PeakModel&) { return 1024; },
                                      ProbePlan{});
  EXPECT_TRUE(pm.model.faster_than_batch.empty());
  for (const PhaseFit& p : pm.model.phases) EXPECT_TRUE(p.curves.empty()) << p.phase;
}

}  // namespace
}  // namespace memfit
