#include "memfit/core/model/reserve_interpolation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "memfit/core/model/allocator_model.h"
#include "memfit/core/model/report.h"
#include "memfit/core/plan/batch_search.h"

#include "step_writer.h"

namespace memfit {
namespace {

constexpr int64_t kMiB = 1 << 20;
constexpr int64_t kWorkspace = kDefaultCudaWorkspaceBytes;

// A step whose sizes the caching allocator rounds into stairs: parameters,
// then two iterations of an input (small pool), three activations of
// different per-sample sizes (20 MiB segments below 10 MiB, 2 MiB rounding
// above), a gradient and a temporary. `split_from`: from that batch on, the
// largest activation is made as two allocations (a kernel that changes
// path with the batch), so steps on either side do not align.
Timeline card_step(int64_t b, int64_t split_from = 0, int64_t ramp_from = 0,
                   bool reverse_frees = false) {
  Timeline t;
  testing::StepWriter step(t);
  t.begin_phase("parameters", 1);
  step.alloc(3 * kMiB + 1000, Category::kParameter, "aten::empty");
  for (int it = 1; it <= 2; ++it) {
    t.begin_phase("inputs", it);
    const uint64_t x = step.alloc(3000 * b, Category::kInput, "aten::copy_");
    t.begin_phase("forward", it);
    std::vector<uint64_t> acts;
    if (split_from > 0 && b >= split_from) {
      acts.push_back(step.alloc(37000 * b / 2, Category::kActivation, "aten::addmm"));
      acts.push_back(step.alloc(37000 * b - 37000 * b / 2, Category::kActivation, "aten::addmm"));
    } else {
      acts.push_back(step.alloc(37000 * b, Category::kActivation, "aten::addmm"));
    }
    acts.push_back(step.alloc(11000 * b + 4096, Category::kActivation, "aten::relu"));
    acts.push_back(step.alloc(5100 * b, Category::kActivation, "aten::addmm"));
    // `ramp_from`: a buffer that is empty below that batch (a kernel's
    // workspace past a size): small probes do not see it.
    if (ramp_from > 0) {
      acts.push_back(step.alloc(60000 * std::max<int64_t>(0, b - ramp_from), Category::kActivation,
                           "aten::conv"));
    }
    t.begin_phase("backward", it);
    const uint64_t tmp = step.alloc(37000 * b, Category::kTemporary, "aten::mm");
    const uint64_t g = step.alloc(3 * kMiB + 1000, Category::kGradient, "aten::mm");
    step.free(tmp);
    if (reverse_frees) std::reverse(acts.begin(), acts.end());  // as threads finish
    for (uint64_t a : acts) step.free(a);
    step.free(x);
    t.begin_phase("zero_grad", it);
    step.free(g);
  }
  t.end_phase();
  return t;
}

int64_t card_peak(const Timeline& t) {
  return std::max(t.peak().bytes, estimate_cuda(t, kWorkspace).peak_reserved);
}

TEST(ReserveInterpolation, BetweenTwoAffineStepsItIsTheReplayOfTheRealOne) {
  const Timeline a = card_step(100), b = card_step(900);
  ASSERT_TRUE(steps_align(a, b));
  const RecordedStep ra{100, &a, kWorkspace}, rb{900, &b, kWorkspace};
  for (int64_t batch : {1, 99, 100, 101, 333, 512, 899, 900, 1500}) {
    EXPECT_EQ(interpolated_budget_peak(ra, rb, batch), card_peak(card_step(batch))) << batch;
  }
}

TEST(ReserveInterpolation, TheLargestBatchUnderALimitIsTheScannedOne) {
  const Timeline a = card_step(200), b = card_step(400);
  const RecordedStep ra{200, &a, kWorkspace}, rb{400, &b, kWorkspace};
  const int64_t limit = 200 * kMiB;
  int64_t scanned = 0;  // the reserve rises with the batch here: scan up
  while (card_peak(card_step(scanned + 1)) <= limit) ++scanned;
  EXPECT_EQ(largest_interpolated_under(ra, rb, limit, 401, 4000), scanned);
  EXPECT_EQ(largest_interpolated_under(ra, rb, limit, scanned + 1, 4000), scanned);
  EXPECT_EQ(largest_interpolated_under(ra, rb, 1, 401, 4000), 400);  // none: lo - 1
}

TEST(ReserveInterpolation, FreesInAnotherOrderStillAlignAndFollowTheSecondStep) {
  const Timeline a = card_step(100), b = card_step(900, 0, 0, /*reverse_frees=*/true);
  ASSERT_TRUE(steps_align(a, b));
  const RecordedStep ra{100, &a, kWorkspace}, rb{900, &b, kWorkspace};
  for (int64_t batch : {150, 500, 899}) {
    EXPECT_EQ(interpolated_budget_peak(ra, rb, batch),
              card_peak(card_step(batch, 0, 0, true)))
        << batch;
  }
}

TEST(ReserveInterpolation, StepsThatAllocateDifferentlyDoNotAlign) {
  EXPECT_FALSE(steps_align(card_step(100, 500), card_step(600, 500)));
  EXPECT_TRUE(steps_align(card_step(600, 500), card_step(700, 500)));
  const Timeline a = card_step(100, 500), b = card_step(600, 500);
  EXPECT_THROW(interpolated_budget_peak({100, &a, 0}, {600, &b, 0}, 300), std::invalid_argument);
  EXPECT_THROW(interpolated_budget_peak({100, &a, 0}, {100, &a, 0}, 300), std::invalid_argument);
}

// The batch search for a card, on the step above.
struct CardStep {
  int64_t split_from = 0;
  int64_t ramp_from = 0;
  std::vector<int64_t> measured = {};

  MeasureStep measure() {
    return [this](int64_t b) {
      measured.push_back(b);
      StepMeasurement m;
      m.timeline = card_step(b, split_from, ramp_from);
      m.report = make_report(m.timeline, {"synthetic", b, "adam", "cpu"});
      m.report.cuda = estimate_cuda(m.timeline, kWorkspace);
      return m;
    };
  }
  // The largest batch whose reserve fits, scanning up from one that does.
  int64_t true_max(int64_t budget, int64_t from) const {
    int64_t b = from;
    while (card_peak(card_step(b + 1, split_from, ramp_from)) <= budget) ++b;
    return b;
  }
};

TEST(ReserveInterpolation, ACardsSearchLandsOnTheLastStairThatFitsInOneStep) {
  // Aimed at the budget, a secant through two reserves lands on the stair
  // above the answer; the replay between two steps does not.
  for (int64_t budget : {96 * kMiB, 200 * kMiB, 256 * kMiB + 3 * kMiB}) {
    CardStep s;
    SearchOptions o;
    o.budget_bytes = budget;
    const BatchFit f = search_batch(s.measure(), o);
    EXPECT_EQ(f.max_batch, s.true_max(budget, f.max_batch)) << budget;
    EXPECT_LE(f.measured_peak_bytes, budget);
    EXPECT_EQ(f.measured_peak_bytes, card_peak(card_step(f.max_batch)));
    EXPECT_EQ(f.trials, 1) << budget;
  }
}

TEST(ReserveInterpolation, ACardsSearchOverStepsThatDoNotAlignNeverOvershoots) {
  CardStep s{/*split_from=*/1500};
  SearchOptions o;
  o.budget_bytes = 200 * kMiB;
  const BatchFit f = search_batch(s.measure(), o);
  EXPECT_LE(f.measured_peak_bytes, o.budget_bytes);
  EXPECT_LE(card_peak(card_step(f.max_batch, 1500)), o.budget_bytes);
  EXPECT_LE(f.max_batch, s.true_max(o.budget_bytes, f.max_batch));
}

TEST(ReserveInterpolation, ACardsSearchRecoversWhenTheProbesUnderPredictIt) {
  // The probes (up to 512 here) never see the buffer that starts at 600:
  // the candidate extrapolated from them fails, and the search then
  // interpolates inside the whole bracket [largest fit, failure], not just
  // up to twice the largest fit (which took a third step).
  CardStep s{/*split_from=*/0, /*ramp_from=*/600};
  SearchOptions o;
  o.budget_bytes = 300 * kMiB;
  const BatchFit f = search_batch(s.measure(), o);
  const int64_t truth = s.true_max(o.budget_bytes, f.max_batch);
  EXPECT_LE(card_peak(card_step(f.max_batch, 0, 600)), o.budget_bytes);
  EXPECT_GE(f.max_batch * 100, truth * 95) << f.max_batch << " of " << truth;
  EXPECT_LE(f.trials, 2);  // the failure, then one inside the bracket
}

}  // namespace
}  // namespace memfit
