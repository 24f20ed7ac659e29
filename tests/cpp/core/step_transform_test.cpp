// Steps predicted from a recording (Note [Steps predicted from a
// recording]) on the recorded step of training_step.h: gradients 3 MiB,
// optimizer state 6 MiB, parameters 3 MiB, the peak in backward 2.
#include "memfit/core/model/step_transform.h"

#include <gtest/gtest.h>

#include "memfit/core/model/report.h"
#include "training_step.h"

namespace memfit {
namespace {

using testing::kKiB;
using testing::kMiB;

int64_t phase_peak(const Report& r, const char* phase, int iteration) {
  for (const auto& p : r.phases) {
    if (p.name == phase && p.iteration == iteration) return p.peak_bytes;
  }
  return -1;
}

TEST(StepTransformTest, GradientsKeptStayLiveThroughTheNextForward) {
  const Timeline plain = testing::training_step();
  const std::optional<Timeline> kept = with_gradients_kept(plain);
  ASSERT_TRUE(kept.has_value());
  const Report a = make_report(plain, {"step", 4, "adam", "cpu"});
  const Report b = make_report(*kept, {"step", 4, "adam", "cpu"});
  // The first iteration is the plain step's until its zero_grad.
  EXPECT_EQ(phase_peak(b, kPhaseForward, 1), phase_peak(a, kPhaseForward, 1));
  EXPECT_EQ(phase_peak(b, kPhaseBackward, 1), phase_peak(a, kPhaseBackward, 1));
  // Then the 3 MiB of gradients stay: forward 2 holds them on top.
  EXPECT_EQ(phase_peak(b, kPhaseForward, 2), phase_peak(a, kPhaseForward, 2) + 3 * kMiB);
  // At the plain step's peak its first new gradient (512 KiB) was made:
  // kept, it is added into the old one and freed.
  EXPECT_EQ(b.peak_bytes, a.peak_bytes + 3 * kMiB - 512 * kKiB);
  EXPECT_EQ(b.peak_phase, kPhaseBackward);
  // The events keep their phases: no span lost, none added.
  EXPECT_EQ(kept->phase_spans().size(), plain.phase_spans().size());
}

TEST(StepTransformTest, StateOnHostDropsWhatTheOptimizerStepAllocates) {
  const Timeline plain = testing::training_step();
  const std::optional<Timeline> host = with_state_on_host(plain);
  ASSERT_TRUE(host.has_value());
  const Report a = make_report(plain, {"step", 4, "adam", "cpu"});
  const Report b = make_report(*host, {"step", 4, "adam-offload", "cpu"});
  EXPECT_EQ(b.peak_bytes, a.peak_bytes - 6 * kMiB);  // the state, 2 x the parameters
  EXPECT_EQ(b.categories_at_peak[static_cast<int>(Category::kOptimizerState)], 0);
  for (const auto& e : host->events()) {
    EXPECT_NE(host->phase_name(e.phase), kPhaseOptimizerStep);
  }
}

TEST(StepTransformTest, NothingToPredictFromGivesNothing) {
  EXPECT_FALSE(with_gradients_kept(Timeline()).has_value());
  EXPECT_FALSE(with_state_on_host(Timeline()).has_value());
  Timeline forward_only;
  forward_only.begin_phase(kPhaseForward, 1);
  Event e;
  e.bytes = 100;
  e.id = 1;
  e.phase = forward_only.current_phase();
  forward_only.record(e);
  EXPECT_FALSE(with_gradients_kept(forward_only).has_value());
  EXPECT_FALSE(with_state_on_host(forward_only).has_value());
}

TEST(StepTransformTest, BatchIndependentAtThePeakIsWeightsAndEarlierState) {
  // Parameters 3 MiB and the state of iteration 1 (6 MiB); the gradients at
  // the peak were made in its own iteration: not counted.
  EXPECT_EQ(batch_independent_at_peak(testing::training_step()), 9 * kMiB);
  // Kept from iteration 1, the gradients count too.
  EXPECT_EQ(batch_independent_at_peak(*with_gradients_kept(testing::training_step())),
            12 * kMiB);
  EXPECT_EQ(batch_independent_at_peak(Timeline()), 0);
}

}  // namespace
}  // namespace memfit
