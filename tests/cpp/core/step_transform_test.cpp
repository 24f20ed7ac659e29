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

// Two iterations of one Linear's backward: its node (frame 10, then 20)
// makes the bias's gradient (a sum, 2 KiB) and then the input's gradient
// (an mm, 1 MiB); the next node (frame 11, then 21) allocates 1 MiB. With
// frames = false the events carry none, as a timeline from elsewhere.
Timeline linear_backward_twice(bool frames) {
  Timeline t;
  uint64_t id = 0;
  auto alloc = [&](int64_t bytes, const char* op, uint64_t frame, Category c) {
    Event e;
    e.bytes = bytes;
    e.id = ++id;
    e.op = t.op_index(op);
    e.frame = frames ? frame : 0;
    e.phase = t.current_phase();
    e.category = c;
    t.record(e);
    return e.id;
  };
  auto release = [&](uint64_t which) {
    Event e;
    e.kind = EventKind::kFree;
    e.id = which;
    e.phase = t.current_phase();
    t.record(e);
  };
  for (int it = 1; it <= 2; ++it) {
    t.begin_phase(kPhaseBackward, it);
    const uint64_t frame = it * 10;
    const uint64_t bias = alloc(2 * kKiB, "aten::sum", frame, Category::kGradient);
    const uint64_t input = alloc(kMiB, "aten::mm", frame, Category::kGradient);
    release(input);
    const uint64_t next = alloc(kMiB, "aten::threshold_backward", frame + 1, Category::kGradient);
    release(next);
    t.end_phase();
    t.begin_phase(kPhaseZeroGrad, it);
    release(bias);
    t.end_phase();
  }
  return t;
}

TEST(StepTransformTest, AKeptGradientsNewOneLivesUntilItsNodeReturns) {
  // The bias's new gradient of iteration 2 is added into the kept one after
  // AddmmBackward returns: it is live while the node's mm allocates. The
  // peak: the kept 2 KiB, the new 2 KiB and the 1 MiB of the mm.
  const Timeline with_frames = *with_gradients_kept(linear_backward_twice(true));
  EXPECT_EQ(with_frames.peak().bytes, 4 * kKiB + kMiB);
  // Without frames the next op's allocation frees it: 2 KiB less, as a real
  // step would not.
  const Timeline without = *with_gradients_kept(linear_backward_twice(false));
  EXPECT_EQ(without.peak().bytes, 2 * kKiB + kMiB);
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
