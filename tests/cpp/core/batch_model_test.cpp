#include "memfit/core/model/batch_model.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace memfit {
namespace {

TEST(AffineFitTest, TwoPointsAreFittedExactly) {
  const AffineFit f = fit_affine({{4, 1000}, {8, 1800}});
  EXPECT_DOUBLE_EQ(f.m0, 200);
  EXPECT_DOUBLE_EQ(f.per_sample, 200);
  EXPECT_EQ(f.points, 2);
  EXPECT_EQ(f.distinct_batches, 2);
  EXPECT_LT(f.max_abs_residual, 1e-6);
  EXPECT_EQ(f.predict(0), 200);
  EXPECT_EQ(f.predict(10), 2200);
  EXPECT_TRUE(f.is_affine());
  EXPECT_FALSE(f.checked());  // two batches cannot show a curve
}

TEST(AffineFitTest, PredictRoundsUpToWholeBytes) {
  const AffineFit f = fit_affine({{1, 1000}, {3, 1007}});  // 996.5 + 3.5 b
  EXPECT_DOUBLE_EQ(f.m0, 996.5);
  EXPECT_DOUBLE_EQ(f.per_sample, 3.5);
  EXPECT_EQ(f.predict(0), 997);
  EXPECT_EQ(f.predict(1), 1000);
  EXPECT_EQ(f.predict(2), 1004);
  EXPECT_EQ(f.predict(3), 1007);
}

TEST(AffineFitTest, PredictClampsAtZero) {
  const AffineFit f = fit_affine({{2, 333}, {5, 1000}});  // m0 < 0
  EXPECT_LT(f.m0, 0);
  EXPECT_EQ(f.predict(0), 0);
  EXPECT_EQ(f.predict(1), 111);  // -111.67 + 222.33
}

TEST(AffineFitTest, LeastSquaresOverThreePointsWithResiduals) {
  // Best line through (1,100) (2,205) (3,300): 100 b + 5/3; residuals
  // -5/3, +10/3, -5/3.
  const AffineFit f = fit_affine({{1, 100}, {2, 205}, {3, 300}});
  EXPECT_NEAR(f.per_sample, 100, 1e-9);
  EXPECT_NEAR(f.m0, 5.0 / 3, 1e-9);
  EXPECT_NEAR(f.max_abs_residual, 10.0 / 3, 1e-9);
  // Relative: the worst is 5/3 of 100, not 10/3 of 205.
  EXPECT_NEAR(f.max_rel_residual, 5.0 / 3 / 100, 1e-12);
  EXPECT_EQ(f.points, 3);
  EXPECT_TRUE(f.checked());
  EXPECT_FALSE(f.is_affine(0.01));  // 1.67 % off the line
  EXPECT_TRUE(f.is_affine(0.02));
}

TEST(AffineFitTest, RepeatedBatchesAverage) {
  const AffineFit f = fit_affine({{1, 90}, {1, 110}, {2, 200}, {2, 200}});
  EXPECT_NEAR(f.per_sample, 100, 1e-9);
  EXPECT_NEAR(f.m0, 0, 1e-9);
  EXPECT_NEAR(f.max_abs_residual, 10, 1e-9);
  EXPECT_EQ(f.points, 4);
  EXPECT_EQ(f.distinct_batches, 2);
}

TEST(AffineFitTest, MaxBatchUnderExactFit) {
  const AffineFit f = fit_affine({{4, 1000}, {8, 1800}});  // 200 + 200 b
  EXPECT_EQ(f.max_batch_under(2200), 10);
  EXPECT_EQ(f.max_batch_under(2199), 9);
  EXPECT_EQ(f.max_batch_under(400), 1);
  EXPECT_EQ(f.max_batch_under(399), 0);
  EXPECT_EQ(f.max_batch_under(-5), 0);
  EXPECT_EQ(f.max_batch_under(int64_t{200} + 200 * 1000000), 1000000);
}

// predict(b) <= budget < predict(b + 1), or b == 0 and batch 1 misses.
void expect_consistent(const AffineFit& f, int64_t budget) {
  const int64_t b = f.max_batch_under(budget);
  if (b == 0) {
    EXPECT_GT(f.predict(1), budget) << "budget " << budget;
  } else {
    EXPECT_LE(f.predict(b), budget) << "budget " << budget << " b " << b;
    EXPECT_GT(f.predict(b + 1), budget) << "budget " << budget << " b " << b;
  }
}

TEST(AffineFitTest, MaxBatchUnderIsConsistentWithPredictForEveryBudget) {
  const AffineFit fits[] = {
      fit_affine({{1, 1000}, {3, 1007}}),          // 996.5 + 3.5 b
      fit_affine({{2, 333}, {5, 1000}}),           // thirds, m0 < 0
      fit_affine({{3, 10}, {10, 81}}),             // sevenths
      fit_affine({{1, 100}, {2, 205}, {3, 300}}),  // least squares
  };
  for (const AffineFit& f : fits) {
    SCOPED_TRACE(std::to_string(f.m0) + " + " + std::to_string(f.per_sample) +
                 " b");
    for (int64_t budget = -3; budget <= f.predict(300); ++budget) {
      expect_consistent(f, budget);
    }
  }
}

TEST(AffineFitTest, MaxBatchUnderIsConsistentAtGigabyteScale) {
  // 3.7 GiB fixed and an awkward 39114296.75 B (37.3 MiB) per sample.
  const int64_t m0 = 3972844748;
  const AffineFit f = fit_affine({{3, m0 + 117342890}, {7, m0 + 273800077}});
  for (int64_t b = 0; b <= 500; ++b) {
    const int64_t p = f.predict(b);
    for (int64_t budget : {p - 1, p, p + 1}) expect_consistent(f, budget);
  }
  EXPECT_EQ(f.max_batch_under(int64_t{16} << 30), 337);
}

TEST(AffineFitTest, MaxBatchUnderRefusesMemoryThatDoesNotGrow) {
  const AffineFit f = fit_affine({{1, 1000}, {2, 900}});
  EXPECT_EQ(f.max_batch_under(500), 0);
  try {
    f.max_batch_under(2000);
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[max_batch_under] memory does not "
                                          "grow with the batch",
                                          0),
              0u)
        << e.what();
  }
}

TEST(AffineFitTest, RejectsTooFewPointsOrBatchesAndBadValues) {
  EXPECT_THROW(fit_affine({}), std::invalid_argument);
  EXPECT_THROW(fit_affine({{4, 100}}), std::invalid_argument);
  try {
    fit_affine({{4, 100}, {4, 120}});
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "[fit_affine] every point is at batch 4: measure at two or more "
              "different batch sizes");
  }
  EXPECT_THROW(fit_affine({{0, 100}, {4, 120}}), std::invalid_argument);
  EXPECT_THROW(fit_affine({{-1, 100}, {4, 120}}), std::invalid_argument);
  EXPECT_THROW(fit_affine({{1, -100}, {4, 120}}), std::invalid_argument);
}

}  // namespace
}  // namespace memfit
