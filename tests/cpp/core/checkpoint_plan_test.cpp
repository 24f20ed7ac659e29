#include "memfit/core/plan/checkpoint_plan.h"

#include <gtest/gtest.h>

#include <random>
#include <stdexcept>

namespace memfit {
namespace {

ChainSegment seg(int64_t act, double ns, int64_t input = 0, int64_t extra = 0) {
  ChainSegment s;
  s.activation_bytes = act;
  s.recompute_ns = ns;
  s.input_bytes = input;
  s.backward_extra_bytes = extra;
  return s;
}

// A chain with uneven layers: two wide, cheap-to-recompute layers among
// narrow ones, like attention over a long context next to small MLPs.
std::vector<ChainSegment> uneven_chain() {
  return {seg(10, 10),  seg(100, 12), seg(10, 10), seg(10, 10),
          seg(100, 12), seg(10, 10),  seg(10, 10), seg(10, 10)};
}

TEST(CheckpointPlanTest, PeakFollowsTheNote) {
  const std::vector<ChainSegment> s = {seg(100, 1, 10, 5), seg(50, 1, 20, 0),
                                       seg(30, 1, 0, 7)};
  ChainMemory m;
  m.forward_fixed = 1000;
  m.backward_fixed = 2000;
  m.other_peak = 500;
  // None checkpointed: end of forward 1000+180; backward of segment 2:
  // 2000 + 150 + 30 + 7.
  EXPECT_EQ(chain_peak(s, m, {false, false, false}), 2187);
  // Segment 0 checkpointed: prefix before 2 is 10 + 50; during 0 it holds
  // its input too: 2000 + 10 + 100 + 5 = 2115; during 2: 2000 + 60 + 37.
  EXPECT_EQ(chain_peak(s, m, {true, false, false}), 2115);
  // Checkpointing the last segment does not lower its own backward.
  EXPECT_EQ(chain_peak(s, m, {false, false, true}), 2187);
  m.other_peak = 5000;
  EXPECT_EQ(chain_peak(s, m, {true, true, true}), 5000);
  m.other_peak = 0;
  m.forward_fixed = 9000;
  EXPECT_EQ(chain_peak(s, m, {true, true, true}), 9030);
  EXPECT_THROW(chain_peak(s, m, {true}), std::invalid_argument);
}

TEST(CheckpointPlanTest, OptimalIsTheCheapestSubsetThatFits) {
  // Brute force over every subset of random chains.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> bytes(1, 100);
  std::uniform_real_distribution<double> time(1, 50);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + trial % 9;
    std::vector<ChainSegment> s;
    for (int i = 0; i < n; ++i) {
      s.push_back(seg(bytes(rng), time(rng), bytes(rng) / 10, bytes(rng) / 5));
    }
    ChainMemory m{bytes(rng), bytes(rng), bytes(rng)};
    const int64_t lo = chain_peak(s, m, std::vector<bool>(n, true));
    const int64_t hi = chain_peak(s, m, std::vector<bool>(n, false));
    const int64_t budget = lo + (hi - lo) * (trial % 5) / 4;
    double best = -1;
    for (int mask = 0; mask < (1 << n); ++mask) {
      std::vector<bool> c(n);
      for (int i = 0; i < n; ++i) c[i] = (mask >> i) & 1;
      if (chain_peak(s, m, c) > budget) continue;
      const double t = chain_recompute_ns(s, c);
      if (best < 0 || t < best) best = t;
    }
    const ChainPlan p = chain_plan_optimal(s, m, budget);
    ASSERT_EQ(p.fits, best >= 0) << "trial " << trial;
    if (best >= 0) {
      EXPECT_NEAR(p.recompute_ns, best, 1e-9) << "trial " << trial;
      EXPECT_LE(p.predicted_peak, budget);
    }
  }
}

TEST(CheckpointPlanTest,
     OptimalCostsNoMoreThanEveryLayerAndMeetsBudgetsEveryKCannot) {
  const auto s = uneven_chain();
  const ChainMemory m{0, 1000, 0};
  const int64_t plain = chain_peak(s, m, std::vector<bool>(s.size(), false));
  ASSERT_EQ(plain, 1000 + 250 + 10);  // during the last segment
  // Wherever every layer fits, the optimal plan fits at no more cost.
  const ChainPlan all = chain_plan_every_k(s, m, plain, 1);
  ASSERT_EQ(all.predicted_peak, 1100);
  for (int64_t budget = all.predicted_peak; budget <= plain; budget += 5) {
    const ChainPlan every = chain_plan_every_k(s, m, budget, 1);
    const ChainPlan opt = chain_plan_optimal(s, m, budget);
    ASSERT_TRUE(every.fits);
    ASSERT_TRUE(opt.fits) << budget;
    EXPECT_LE(opt.recompute_ns, every.recompute_ns) << budget;
  }
  // Under 1130 the second wide layer's backward must not see the first's
  // 100 bytes, and the last's must not see the second's: both wide layers
  // checkpointed. Every k-th layer (k >= 2, from the first) keeps segment 1
  // and cannot fit; sqrt(n) fits by recomputing 64 ns, every layer 84 ns,
  // the optimal plan 24 ns.
  const int64_t budget = 1130;
  for (int k = 2; k <= static_cast<int>(s.size()); ++k) {
    EXPECT_FALSE(chain_plan_every_k(s, m, budget, k).fits) << "k=" << k;
  }
  const ChainPlan opt = chain_plan_optimal(s, m, budget);
  EXPECT_TRUE(opt.fits);
  EXPECT_EQ(opt.indices(), "1,4");
  EXPECT_EQ(opt.predicted_peak, 1130);
  EXPECT_DOUBLE_EQ(opt.recompute_ns, 24);
  EXPECT_DOUBLE_EQ(chain_plan_sqrt(s, m, budget).recompute_ns, 64);
  EXPECT_DOUBLE_EQ(chain_plan_every_k(s, m, budget, 1).recompute_ns, 84);
}

TEST(CheckpointPlanTest, OptimalLeavesTheLastSegmentAloneWhenBackwardBinds) {
  const std::vector<ChainSegment> s = {seg(50, 1), seg(50, 1), seg(50, 1)};
  const ChainPlan p = chain_plan_optimal(s, ChainMemory{0, 0, 0}, 100);
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.indices(), "0");  // 0 + 50 + 50 during the last
}

TEST(CheckpointPlanTest, NothingFitsSaysSo) {
  const std::vector<ChainSegment> s = {seg(50, 1), seg(50, 1)};
  const ChainPlan p = chain_plan_optimal(s, ChainMemory{0, 100, 0}, 120);
  EXPECT_FALSE(p.fits);
  // {0} and {0,1} both peak at 150 (the last segment's backward): the least
  // recompute of the two.
  EXPECT_EQ(p.indices(), "0");
  EXPECT_EQ(p.predicted_peak, 150);
  EXPECT_FALSE(chain_plan_optimal(s, ChainMemory{0, 0, 500}, 400).fits);
}

// The demo gpt's case: the optimizer's peak binds every plan, so all peak
// alike; checkpointing buys nothing and the optimal rule must not pay for it.
TEST(CheckpointPlanTest, AmongEqualPeaksOptimalPicksTheLeastRecompute) {
  const std::vector<ChainSegment> s = {seg(40, 5), seg(40, 5)};
  const ChainMemory m{100, 100, 1000};
  for (int64_t budget : {900, 1000, 5000}) {
    const ChainPlan p = chain_plan_optimal(s, m, budget);
    EXPECT_EQ(p.predicted_peak, 1000) << budget;
    EXPECT_EQ(p.indices(), "-") << budget;
    EXPECT_DOUBLE_EQ(p.recompute_ns, 0) << budget;
  }
}

TEST(CheckpointPlanTest, RulesPickTheirSegments) {
  std::vector<ChainSegment> s(9, seg(10, 1));
  const ChainMemory m{};
  EXPECT_EQ(chain_plan_every_k(s, m, 0, 1).indices(), "0,1,2,3,4,5,6,7,8");
  EXPECT_EQ(chain_plan_every_k(s, m, 0, 3).rule, "every 3rd layer");
  EXPECT_EQ(chain_plan_every_k(s, m, 0, 3).indices(), "0,3,6");
  EXPECT_EQ(chain_plan_sqrt(s, m, 0).indices(), "0,1,3,4,6,7");
  EXPECT_EQ(chain_plan_none(s, m, 0).indices(), "-");
  EXPECT_THROW(chain_plan_every_k(s, m, 0, 0), std::invalid_argument);
  const auto table = compare_chain_plans(s, m, 100);
  EXPECT_EQ(table.front().rule, "none");
  EXPECT_EQ(table.back().rule, "optimal");
}

}  // namespace
}  // namespace memfit
