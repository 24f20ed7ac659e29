#include "memfit/core/model/timeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace memfit {
namespace {

using Named = std::vector<std::pair<std::string, int64_t>>;

void alloc(Timeline& t, uint64_t id, int64_t bytes, Category c, uint32_t module,
           int64_t time_ns, Device d = Device::kCPU) {
  Event e;
  e.kind = EventKind::kAlloc;
  e.id = id;
  e.bytes = bytes;
  e.category = c;
  e.module = module;
  e.time_ns = time_ns;
  e.device = d;
  e.phase = t.current_phase();
  t.record(e);
}

// Frees carry no size or category: the timeline takes them from the
// allocation.
void free_id(Timeline& t, uint64_t id, int64_t time_ns,
             Device d = Device::kCPU) {
  Event e;
  e.kind = EventKind::kFree;
  e.id = id;
  e.time_ns = time_ns;
  e.device = d;
  e.phase = t.current_phase();
  t.record(e);
}

// A small training step. Live bytes after each event:
//   params    e0 1000  e1 1500
//   forward   e2 3500  e3 3800  e4 3500  e5 7500
//   backward  e6 8500  e7 4500  e8 5000  e9 3000
//   optimizer e10 5000 e11 6000
//   zero_grad (no events)
Timeline training_step() {
  Timeline t;
  const uint32_t fc1 = t.module_index("model.fc1");
  const uint32_t fc2 = t.module_index("model.fc2");
  t.begin_phase("params", 0);
  alloc(t, 1, 1000, Category::kParameter, fc1, 10);
  alloc(t, 2, 500, Category::kParameter, fc2, 20);
  t.end_phase();
  t.begin_phase("forward", 0);
  alloc(t, 3, 2000, Category::kActivation, fc1, 30);
  alloc(t, 4, 300, Category::kTemporary, fc2, 40);
  free_id(t, 4, 50);
  alloc(t, 5, 4000, Category::kActivation, fc2, 60);
  t.begin_phase("backward", 0);  // ends forward
  alloc(t, 6, 1000, Category::kGradient, fc1, 70);
  free_id(t, 5, 80);
  alloc(t, 7, 500, Category::kGradient, fc2, 90);
  free_id(t, 99, 95);  // allocated before recording: ignored
  free_id(t, 3, 100);
  free_id(t, 5, 105);  // second free: ignored
  t.end_phase();
  t.begin_phase("optimizer", 0);
  alloc(t, 8, 2000, Category::kOther, 0, 110);
  alloc(t, 9, 1000, Category::kOptimizerState, 0, 120);
  t.end_phase();
  t.begin_phase("zero_grad", 0);
  t.end_phase();
  return t;
}

TEST(TimelineTest, InterningStartsWithEmptyNameAndIsStable) {
  Timeline t;
  EXPECT_EQ(t.phase_name(0), "");
  EXPECT_EQ(t.module_name(0), "");
  EXPECT_EQ(t.op_name(0), "");
  EXPECT_EQ(t.phase_index(""), 0);
  EXPECT_EQ(t.phase_index("forward"), 1);
  EXPECT_EQ(t.phase_index("backward"), 2);
  EXPECT_EQ(t.phase_index("forward"), 1);
  EXPECT_EQ(t.module_index("a.very.long.module.path.that.defeats.sso"), 1u);
  EXPECT_EQ(t.module_index("a.very.long.module.path.that.defeats.sso"), 1u);
  EXPECT_EQ(t.op_index("aten::mm"), 1u);
  EXPECT_EQ(t.phase_name(2), "backward");
  EXPECT_EQ(t.module_name(1), "a.very.long.module.path.that.defeats.sso");
  EXPECT_EQ(t.op_name(1), "aten::mm");
  EXPECT_THROW(t.phase_name(3), std::invalid_argument);
  EXPECT_THROW(t.op_name(2), std::invalid_argument);
}

TEST(TimelineTest, CopiesKeepTheirOwnNames) {
  Timeline copy;
  {
    Timeline t;
    t.module_index("encoder.layers.0.self_attn.out_proj");
    copy = t;
  }  // the original's strings are gone
  EXPECT_EQ(copy.module_index("encoder.layers.0.self_attn.out_proj"), 1u);
  EXPECT_EQ(copy.module_index("decoder"), 2u);
}

TEST(TimelineTest, UnknownAndRepeatedFreesAreIgnored) {
  const Timeline t = training_step();
  ASSERT_EQ(t.size(), 12u);
  EXPECT_EQ(t.events()[4].kind, EventKind::kFree);
  EXPECT_EQ(t.events()[4].bytes, 300);  // taken from the allocation
  EXPECT_EQ(t.events()[4].category, Category::kTemporary);
  EXPECT_EQ(t.live_bytes(), 6000);
}

TEST(TimelineTest, AllocationsAndFreesKnowEachOther) {
  const Timeline t = training_step();
  EXPECT_EQ(t.partner(3), 4u);  // id 4, freed right away
  EXPECT_EQ(t.partner(4), 3u);
  EXPECT_EQ(t.partner(0), kNoEvent);  // a parameter, live to the end
  for (size_t i = 0; i < t.size(); ++i) {
    if (t.partner(i) == kNoEvent) continue;
    EXPECT_EQ(t.partner(t.partner(i)), i) << i;
    EXPECT_EQ(t.events()[t.partner(i)].id, t.events()[i].id) << i;
  }
  EXPECT_THROW(t.partner(t.size()), std::invalid_argument);
}

TEST(TimelineTest, LiveAfterEachEvent) {
  const Timeline t = training_step();
  const std::vector<int64_t> expected = {1000, 1500, 3500, 3800, 3500, 7500,
                                         8500, 4500, 5000, 3000, 5000, 6000};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(t.live_after(i), expected[i]) << i;
  }
  EXPECT_EQ(t.live_curve(), expected);
  EXPECT_THROW(t.live_after(12), std::invalid_argument);
}

TEST(TimelineTest, PeakIsMaxOfLiveBytes) {
  const Timeline t = training_step();
  const Timeline::Peak p = t.peak();
  EXPECT_EQ(p.bytes, 8500);
  EXPECT_EQ(p.event_index, 6u);
  EXPECT_EQ(t.phase_name(p.phase), "backward");
  EXPECT_EQ(t.module_name(p.module), "model.fc1");
  EXPECT_EQ(p.op, 0u);
  EXPECT_EQ(p.time_ns, 70);
}

TEST(TimelineTest, PeakIsTheFirstEventReachingTheMax) {
  Timeline t;
  alloc(t, 1, 100, Category::kOther, 0, 1);
  free_id(t, 1, 2);
  alloc(t, 2, 100, Category::kOther, 0, 3);
  EXPECT_EQ(t.peak().event_index, 0u);
}

TEST(TimelineTest, EmptyTimelinePeakIsZeroAtNoEvent) {
  const Timeline t;
  const Timeline::Peak p = t.peak();
  EXPECT_EQ(p.bytes, 0);
  EXPECT_EQ(p.event_index, kNoEvent);
  EXPECT_EQ(t.live_bytes(), 0);
  EXPECT_TRUE(t.curve().empty());
  EXPECT_TRUE(t.phase_summaries().empty());
}

TEST(TimelineTest, PeakInRange) {
  const Timeline t = training_step();
  const Timeline::Peak p = t.peak_in(7, 12);
  EXPECT_EQ(p.bytes, 6000);
  EXPECT_EQ(p.event_index, 11u);
  EXPECT_EQ(t.phase_name(p.phase), "optimizer");
  const Timeline::Peak empty = t.peak_in(7, 7);
  EXPECT_EQ(empty.bytes, 8500);  // live before event 7
  EXPECT_EQ(empty.event_index, kNoEvent);
  EXPECT_THROW(t.peak_in(5, 4), std::invalid_argument);
  EXPECT_THROW(t.peak_in(0, 13), std::invalid_argument);
}

TEST(TimelineTest, BreakdownAtPeakByCategoryPhaseAndModule) {
  const Timeline t = training_step();
  const Timeline::Breakdown b = t.breakdown_after(t.peak().event_index);
  EXPECT_EQ(b.total, 8500);
  std::array<int64_t, kNumCategories> cats{};
  cats[static_cast<size_t>(Category::kParameter)] = 1500;
  cats[static_cast<size_t>(Category::kActivation)] = 6000;
  cats[static_cast<size_t>(Category::kGradient)] = 1000;
  EXPECT_EQ(b.by_category, cats);
  EXPECT_EQ(b.by_phase,
            (Named{{"forward", 6000}, {"params", 1500}, {"backward", 1000}}));
  EXPECT_EQ(b.by_module, (Named{{"model.fc2", 4500}, {"model.fc1", 4000}}));
}

TEST(TimelineTest, BreakdownAtAnArbitraryInstantIncludesTemporaries) {
  const Timeline t = training_step();
  const Timeline::Breakdown b = t.breakdown_after(3);
  EXPECT_EQ(b.total, 3800);
  EXPECT_EQ(b.by_category[static_cast<size_t>(Category::kParameter)], 1500);
  EXPECT_EQ(b.by_category[static_cast<size_t>(Category::kActivation)], 2000);
  EXPECT_EQ(b.by_category[static_cast<size_t>(Category::kTemporary)], 300);
  EXPECT_EQ(b.by_phase, (Named{{"forward", 2300}, {"params", 1500}}));
  EXPECT_EQ(b.by_module, (Named{{"model.fc1", 3000}, {"model.fc2", 800}}));
  // One event later the temporary is gone.
  EXPECT_EQ(t.breakdown_after(4)
                .by_category[static_cast<size_t>(Category::kTemporary)],
            0);
  EXPECT_THROW(t.breakdown_after(12), std::invalid_argument);
}

TEST(TimelineTest, SetCategoryChangesBreakdown) {
  Timeline t = training_step();
  const auto other = static_cast<size_t>(Category::kOther);
  const auto state = static_cast<size_t>(Category::kOptimizerState);
  Timeline::Breakdown before = t.breakdown_after(11);
  EXPECT_EQ(before.by_category[other], 2000);
  EXPECT_EQ(before.by_category[state], 1000);

  EXPECT_TRUE(t.set_category(8, Category::kOptimizerState));
  EXPECT_FALSE(t.set_category(99, Category::kOptimizerState));
  EXPECT_EQ(t.category_of(8), Category::kOptimizerState);

  const Timeline::Breakdown b = t.breakdown_after(11);
  EXPECT_EQ(b.total, 6000);
  std::array<int64_t, kNumCategories> cats{};
  cats[static_cast<size_t>(Category::kParameter)] = 1500;
  cats[static_cast<size_t>(Category::kGradient)] = 1500;
  cats[state] = 3000;
  EXPECT_EQ(b.by_category, cats);
  // Ties (backward and params, 1500 each) are ordered by name.
  EXPECT_EQ(b.by_phase,
            (Named{{"optimizer", 3000}, {"backward", 1500}, {"params", 1500}}));
  EXPECT_EQ(b.by_module,
            (Named{{"", 3000}, {"model.fc1", 2000}, {"model.fc2", 1000}}));
}

TEST(TimelineTest, SetCategoryOnAFreedAllocationAlsoRelabelsItsFree) {
  Timeline t = training_step();
  EXPECT_TRUE(t.set_category(4, Category::kActivation));
  EXPECT_EQ(t.events()[3].category, Category::kActivation);
  EXPECT_EQ(t.events()[4].category, Category::kActivation);
}

TEST(TimelineTest, CategoryOfAndIsLive) {
  const Timeline t = training_step();
  EXPECT_EQ(t.category_of(3), Category::kActivation);
  EXPECT_TRUE(t.is_live(1));
  EXPECT_FALSE(t.is_live(5));
  EXPECT_FALSE(t.is_live(99));
  EXPECT_THROW(t.category_of(99), std::invalid_argument);
}

TEST(TimelineTest, ModuleBytesForOneCategory) {
  const Timeline t = training_step();
  EXPECT_EQ(t.module_bytes_after(6, Category::kActivation),
            (Named{{"model.fc2", 4000}, {"model.fc1", 2000}}));
  EXPECT_EQ(t.module_bytes_after(6, Category::kGradient),
            (Named{{"model.fc1", 1000}}));
  EXPECT_TRUE(t.module_bytes_after(6, Category::kBuffer).empty());
}

TEST(TimelineTest, CategoryOfFreedIdsIsIndexedNotScanned) {
  // 200000 freed ids asked about one by one: a scan per question would be
  // 2e10 steps (the test would time out); the index answers each in O(1).
  Timeline t;
  constexpr uint64_t kIds = 200000;
  for (uint64_t i = 0; i < kIds; ++i) {
    alloc(t, i, 64, i % 2 ? Category::kActivation : Category::kTemporary, 0, 0);
    free_id(t, i, 0);
  }
  size_t activations = 0;
  for (uint64_t i = 0; i < kIds; ++i) {
    activations += t.category_of(i) == Category::kActivation;
  }
  EXPECT_EQ(activations, kIds / 2);
  // Events after the index was built are seen too, and copies answer alike.
  alloc(t, 6, 64, Category::kGradient, 0, 0);
  free_id(t, 6, 0);
  EXPECT_EQ(t.category_of(6), Category::kGradient);
  EXPECT_TRUE(t.set_category(6, Category::kBuffer));
  const Timeline copy = t;
  EXPECT_EQ(copy.category_of(6), Category::kBuffer);
  EXPECT_EQ(copy.category_of(7), Category::kActivation);
  EXPECT_THROW(copy.category_of(kIds), std::invalid_argument);
}

TEST(TimelineTest, IdsAreReusableAfterTheirFree) {
  Timeline t;
  alloc(t, 42, 100, Category::kOther, 0, 1);
  free_id(t, 42, 2);
  alloc(t, 42, 250, Category::kActivation, 0, 3);
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(t.live_bytes(), 250);
  EXPECT_EQ(t.category_of(42), Category::kActivation);
  free_id(t, 42, 4);
  EXPECT_EQ(t.events()[3].bytes, 250);
  EXPECT_EQ(t.live_bytes(), 0);
}

TEST(TimelineTest, AllocatingALiveIdFreesTheEarlierAllocation) {
  Timeline t;
  alloc(t, 7, 100, Category::kOther, 0, 1);
  alloc(t, 7, 50, Category::kOther, 0, 2);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t.events()[1].kind, EventKind::kFree);
  EXPECT_EQ(t.events()[1].bytes, 100);
  EXPECT_EQ(t.live_bytes(), 50);
  EXPECT_EQ(t.peak().bytes, 100);
}

TEST(TimelineTest, PhasesDoNotNestAndSpansCoverTheirEvents) {
  const Timeline t = training_step();
  const std::vector<PhaseSpan>& spans = t.phase_spans();
  ASSERT_EQ(spans.size(), 5u);
  const std::vector<std::pair<size_t, size_t>> expected = {
      {0, 2}, {2, 6}, {6, 10}, {10, 12}, {12, 12}};
  for (size_t i = 0; i < spans.size(); ++i) {
    EXPECT_EQ(spans[i].first_event, expected[i].first) << i;
    EXPECT_EQ(spans[i].end_event, expected[i].second) << i;
  }
  EXPECT_EQ(t.phase_name(spans[2].phase), "backward");
  EXPECT_EQ(t.current_phase(), 0);
}

TEST(TimelineTest, OpenPhaseFollowsTheRecordingAndEndPhaseIsIdempotent) {
  Timeline t;
  t.begin_phase("forward", 3);
  EXPECT_EQ(t.current_phase(), t.phase_index("forward"));
  alloc(t, 1, 10, Category::kOther, 0, 1);
  alloc(t, 2, 10, Category::kOther, 0, 2);
  EXPECT_EQ(t.phase_spans().back().end_event, 2u);
  EXPECT_EQ(t.phase_spans().back().iteration, 3);
  free_id(t, 77, 3);  // ignored: does not extend the span
  EXPECT_EQ(t.phase_spans().back().end_event, 2u);
  t.end_phase();
  t.end_phase();
  alloc(t, 3, 10, Category::kOther, 0, 4);
  EXPECT_EQ(t.phase_spans().size(), 1u);
  EXPECT_EQ(t.phase_spans().back().end_event, 2u);
  EXPECT_EQ(t.events()[2].phase, 0);
}

TEST(TimelineTest, PhaseSummariesPinLiveBeforeAfterDeltaAndPeak) {
  const Timeline t = training_step();
  const std::vector<Timeline::PhaseSummary> s = t.phase_summaries();
  ASSERT_EQ(s.size(), 5u);
  struct Expected {
    const char* name;
    int64_t before, after, delta, peak;
    size_t peak_event;
  };
  const Expected expected[] = {
      {"params", 0, 1500, 1500, 1500, 1},
      {"forward", 1500, 7500, 6000, 7500, 5},
      {"backward", 7500, 3000, -4500, 8500, 6},
      {"optimizer", 3000, 6000, 3000, 6000, 11},
      {"zero_grad", 6000, 6000, 0, 6000, kNoEvent},
  };
  for (size_t i = 0; i < s.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(s[i].name, expected[i].name);
    EXPECT_EQ(s[i].iteration, 0);
    EXPECT_EQ(s[i].live_before, expected[i].before);
    EXPECT_EQ(s[i].live_after, expected[i].after);
    EXPECT_EQ(s[i].delta, expected[i].delta);
    EXPECT_EQ(s[i].peak, expected[i].peak);
    EXPECT_EQ(s[i].peak_event, expected[i].peak_event);
  }
}

TEST(TimelineTest, PhaseThatOnlyFreesPeaksAtItsStart) {
  Timeline t;
  alloc(t, 1, 100, Category::kOther, 0, 1);
  t.begin_phase("zero_grad", 1);
  free_id(t, 1, 2);
  t.end_phase();
  const auto s = t.phase_summaries();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].live_before, 100);
  EXPECT_EQ(s[0].live_after, 0);
  EXPECT_EQ(s[0].delta, -100);
  EXPECT_EQ(s[0].peak, 100);
  EXPECT_EQ(s[0].peak_event, kNoEvent);
  EXPECT_EQ(s[0].iteration, 1);
}

TEST(TimelineTest, FilteredKeepsOneDeviceAndRemapsSpans) {
  Timeline t;
  t.begin_phase("forward", 0);
  alloc(t, 1, 100, Category::kOther, 0, 1, Device::kCPU);
  alloc(t, 2, 1000, Category::kActivation, 0, 2, Device::kCUDA);
  alloc(t, 3, 50, Category::kOther, 0, 3, Device::kCPU);
  t.begin_phase("backward", 0);
  alloc(t, 4, 500, Category::kGradient, 0, 4, Device::kCUDA);
  // A free stamped with the wrong device still follows its allocation.
  free_id(t, 2, 5, Device::kCPU);
  free_id(t, 1, 6, Device::kCPU);
  t.end_phase();
  ASSERT_EQ(t.size(), 6u);
  EXPECT_EQ(t.peak().bytes, 1650);

  const Timeline cuda = t.filtered(Device::kCUDA);
  ASSERT_EQ(cuda.size(), 3u);
  EXPECT_EQ(cuda.peak().bytes, 1500);
  EXPECT_EQ(cuda.peak().event_index, 1u);
  EXPECT_EQ(cuda.live_bytes(), 500);
  ASSERT_EQ(cuda.phase_spans().size(), 2u);
  EXPECT_EQ(cuda.phase_spans()[0].first_event, 0u);
  EXPECT_EQ(cuda.phase_spans()[0].end_event, 1u);
  EXPECT_EQ(cuda.phase_spans()[1].first_event, 1u);
  EXPECT_EQ(cuda.phase_spans()[1].end_event, 3u);
  EXPECT_EQ(cuda.phase_name(cuda.phase_spans()[1].phase), "backward");
  EXPECT_TRUE(cuda.is_live(4));
  EXPECT_FALSE(cuda.is_live(2));

  const Timeline cpu = t.filtered(Device::kCPU);
  ASSERT_EQ(cpu.size(), 3u);
  EXPECT_EQ(cpu.peak().bytes, 150);
  EXPECT_EQ(cpu.live_bytes(), 50);
  EXPECT_EQ(cpu.phase_spans()[0].end_event, 2u);
  EXPECT_EQ(cpu.phase_spans()[1].first_event, 2u);
  EXPECT_EQ(cpu.phase_spans()[1].end_event, 3u);

  const Timeline meta = t.filtered(Device::kMeta);
  EXPECT_EQ(meta.size(), 0u);
  ASSERT_EQ(meta.phase_spans().size(), 2u);
  EXPECT_EQ(meta.phase_spans()[1].first_event, 0u);
  EXPECT_EQ(meta.phase_spans()[1].end_event, 0u);
}

TEST(TimelineTest, CurveIsTimeAndLiveAfterEachEvent) {
  const Timeline t = training_step();
  const std::vector<std::pair<int64_t, int64_t>> expected = {
      {10, 1000}, {20, 1500},  {30, 3500},  {40, 3800},
      {50, 3500}, {60, 7500},  {70, 8500},  {80, 4500},
      {90, 5000}, {100, 3000}, {110, 5000}, {120, 6000}};
  EXPECT_EQ(t.curve(), expected);
  EXPECT_EQ(t.curve(12), expected);  // already fits
  EXPECT_THROW(t.curve(3), std::invalid_argument);
}

TEST(TimelineTest, CurveDownsamplingKeepsEachRunsLowAndHigh) {
  // live: 10 40 30 35 55 25 20 120 20 0
  Timeline t;
  alloc(t, 1, 10, Category::kOther, 0, 0);
  alloc(t, 2, 30, Category::kOther, 0, 1);
  free_id(t, 1, 2);
  alloc(t, 3, 5, Category::kOther, 0, 3);
  alloc(t, 4, 20, Category::kOther, 0, 4);
  free_id(t, 2, 5);
  free_id(t, 3, 6);
  alloc(t, 5, 100, Category::kOther, 0, 7);
  free_id(t, 5, 8);
  free_id(t, 4, 9);
  // Two runs of the 8 interior events: [1,5) and [5,9).
  EXPECT_EQ(t.curve_indices(6), (std::vector<size_t>{0, 2, 4, 6, 7, 9}));
  EXPECT_EQ(t.curve(6),
            (std::vector<std::pair<int64_t, int64_t>>{
                {0, 10}, {2, 30}, {4, 55}, {6, 20}, {7, 120}, {9, 0}}));
}

TEST(TimelineTest, CurveDownsamplingKeepsTheGlobalPeak) {
  Timeline t;
  // 5000 alloc/free pairs of varying size, one much larger than the rest.
  for (uint64_t i = 0; i < 5000; ++i) {
    const int64_t bytes = i == 3337 ? 1 << 20 : 1000 + (i * 7919) % 4096;
    alloc(t, i, bytes, Category::kOther, 0, static_cast<int64_t>(2 * i));
    free_id(t, i, static_cast<int64_t>(2 * i + 1));
  }
  const Timeline::Peak p = t.peak();
  ASSERT_EQ(p.event_index, 6674u);
  for (size_t max_points : {4u, 5u, 10u, 101u, 2000u}) {
    SCOPED_TRACE(max_points);
    const auto c = t.curve(max_points);
    EXPECT_LE(c.size(), max_points);
    EXPECT_EQ(c.front(), t.curve().front());
    EXPECT_EQ(c.back(), t.curve().back());
    EXPECT_NE(std::find(c.begin(), c.end(),
                        std::make_pair(p.time_ns, int64_t{1} << 20)),
              c.end());
  }
}

TEST(TimelineTest, TwoMillionEventsRecordAndAnalyseExactly) {
  // 1000 allocations live at a time, 4 KiB each but one of 1 MiB; the
  // free of i-1000 comes just before the allocation of i. How fast this
  // runs is bench/core/timeline_bench.cpp's business, not a test's.
  constexpr uint64_t kAllocs = 1000500;
  constexpr uint64_t kSpecial = 500000;
  Timeline t;
  for (uint64_t i = 0; i < kAllocs; ++i) {
    if (i % 100000 == 0) t.begin_phase("step", static_cast<int>(i / 100000));
    if (i >= 1000) free_id(t, i - 1000, static_cast<int64_t>(i));
    alloc(t, i, i == kSpecial ? 1 << 20 : 4096,
          i == kSpecial ? Category::kActivation : Category::kTemporary, 0,
          static_cast<int64_t>(i));
  }
  t.end_phase();
  const Timeline::Peak p = t.peak();
  const Timeline::Breakdown b = t.breakdown_after(p.event_index);
  const auto summaries = t.phase_summaries();
  const auto curve = t.curve(2000);

  ASSERT_EQ(t.size(), 2000000u);
  EXPECT_EQ(p.bytes, 999 * 4096 + (1 << 20));
  EXPECT_EQ(p.event_index, 2 * kSpecial - 999);
  EXPECT_EQ(b.total, p.bytes);
  EXPECT_EQ(b.by_category[static_cast<size_t>(Category::kActivation)], 1 << 20);
  EXPECT_EQ(b.by_category[static_cast<size_t>(Category::kTemporary)],
            999 * 4096);
  EXPECT_EQ(t.live_bytes(), 1000 * 4096);
  ASSERT_EQ(summaries.size(), 11u);
  EXPECT_EQ(summaries[5].peak, p.bytes);
  EXPECT_EQ(summaries[5].peak_event, p.event_index);
  EXPECT_LE(curve.size(), 2000u);
}

}  // namespace
}  // namespace memfit
