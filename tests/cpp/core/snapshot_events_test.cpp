#include "memfit/core/model/snapshot_events.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace memfit {
namespace {

constexpr int64_t MiB = 1 << 20;

struct TraceWriter {
  SnapshotTrace t;
  void add(TraceAction a, uint64_t addr, int64_t size, uint32_t stack) {
    t.action.push_back(static_cast<uint8_t>(a));
    t.addr.push_back(addr);
    t.size.push_back(size);
    t.stream.push_back(0);
    t.time_us.push_back(static_cast<int64_t>(t.action.size()));
    t.stack.push_back(stack);
  }
};

// Stacks: 0 says nothing, 1 forward, 2 backward, 3 the user's own code.
SnapshotEventsInput stacks_said() {
  SnapshotEventsInput in;
  in.stack_phase = {"", "forward", "backward", "user"};
  in.stack_place = {"", "net.py:3 forward", "", "train.py:9 main"};
  return in;
}

Category category_of(const SnapshotEvents& e, size_t event) {
  return e.timeline.events()[event].category;
}

TEST(SnapshotEventsTest, BlocksFromBeforeTheTraceComeFirstAndCountAsLiveFromItsStart) {
  TraceWriter w;
  w.add(TraceAction::kFreeRequested, 0x9000, 256, 0);  // never allocated in the trace
  w.add(TraceAction::kAlloc, 0x1000, 512, 1);
  SnapshotEventsInput in = stacks_said();
  in.live_at_dump = {{0x7000, 128, 0}, {0x1000, 512, 1}};  // 0x1000 the trace made
  const SnapshotEvents e = snapshot_events(w.t, in);
  EXPECT_EQ(e.pre_existing, 2);
  EXPECT_EQ(e.allocated_at_start, 256 + 128);
  EXPECT_EQ(e.trace_index, (std::vector<int64_t>{-1, -1, 0, 1}));
  ASSERT_EQ(e.notes.size(), 1u);
  EXPECT_EQ(e.notes[0].find("the trace starts after 2 allocations were made (384 bytes)"), 0u);
}

TEST(SnapshotEventsTest, ReservedBytesRunFromTheDumpBack) {
  TraceWriter w;
  w.add(TraceAction::kSegmentAlloc, 0x1000, 2 * MiB, 0);
  w.add(TraceAction::kAlloc, 0x1000, 512, 1);
  w.add(TraceAction::kOom, 4096, 8 * MiB, 1);
  w.add(TraceAction::kSegmentFree, 0x1000, 2 * MiB, 0);
  SnapshotEventsInput in = stacks_said();
  in.reserved_at_dump = 20 * MiB;
  const SnapshotEvents e = snapshot_events(w.t, in);
  EXPECT_EQ(e.reserved_at_start, 20 * MiB);
  EXPECT_EQ(e.peak_reserved_bytes, 22 * MiB);
  EXPECT_EQ(e.peak_reserved_trace_index, 0);
  EXPECT_EQ(e.reserved_after, (std::vector<int64_t>{22 * MiB}));
  ASSERT_EQ(e.ooms.size(), 1u);
  EXPECT_EQ(e.ooms[0].trace_index, 2);
  EXPECT_EQ(e.ooms[0].size, 8 * MiB);
  EXPECT_EQ(e.ooms[0].device_free, 4096u);
  EXPECT_EQ(e.ooms[0].events_before, 1);
  EXPECT_EQ(e.ooms[0].reserved, 22 * MiB);
  EXPECT_FALSE(e.expandable);
}

// Forward keeps an activation and frees a temporary; backward's first
// 32 MiB block, never freed, is cuBLAS's workspace, its second the step's.
TEST(SnapshotEventsTest, CategoriesFromPhaseAndLifetimeWithWorkspacesApart) {
  TraceWriter w;
  w.add(TraceAction::kAlloc, 0x100, 1000, 3);        // inputs (the user's code)
  w.add(TraceAction::kAlloc, 0x200, 4000, 1);        // activation
  w.add(TraceAction::kAlloc, 0x300, 64, 1);          // temporary
  w.add(TraceAction::kFreeRequested, 0x300, 64, 1);
  w.add(TraceAction::kAlloc, 0x400, 32 * MiB, 2);    // workspace
  w.add(TraceAction::kAlloc, 0x500, 32 * MiB, 2);    // a gradient of that size
  w.add(TraceAction::kFreeRequested, 0x200, 4000, 2);
  const SnapshotEvents e = snapshot_events(w.t, stacks_said());
  using S = SpanStart;
  EXPECT_EQ(e.spans, (std::vector<S>{S{0, "inputs", 1}, S{1, "forward", 1}, S{4, "backward", 1}}));
  EXPECT_EQ(e.phase_of_alloc,
            (std::vector<std::string>{"inputs", "forward", "forward", "backward", "backward"}));
  EXPECT_EQ(category_of(e, 0), Category::kInput);
  EXPECT_EQ(category_of(e, 1), Category::kActivation);
  EXPECT_EQ(category_of(e, 2), Category::kTemporary);
  EXPECT_EQ(category_of(e, 4), Category::kWorkspace);
  EXPECT_EQ(category_of(e, 5), Category::kGradient);
  EXPECT_EQ(e.timeline.module_name(e.timeline.events()[1].module), "net.py:3 forward");
}

TEST(SnapshotEventsTest, AStackWithoutWhatItsFramesSayIsRefused) {
  TraceWriter w;
  w.add(TraceAction::kAlloc, 0x100, 8, 7);
  EXPECT_THROW(snapshot_events(w.t, stacks_said()), std::invalid_argument);
}

// A trace whose ring buffer dropped its oldest entries: what was live
// before it is one span, each block categorised by its own frames: made in
// forward and never freed at cuBLAS's size, a workspace; frameless at that
// size, autograd's thread's workspace (other blocks have frames: the
// history was on); freed by zero_grad, a gradient; freed by the user's
// code, unknown. Stacks as stacks_said(), 4 zero_grad.
TEST(SnapshotEventsTest, BlocksFromBeforeATraceThatDroppedEntriesGoByTheirOwnFrames) {
  TraceWriter w;
  w.add(TraceAction::kFreeRequested, 0x9000, 4096, 4);  // a gradient, freed by zero_grad
  w.add(TraceAction::kFreeRequested, 0xa000, 2048, 3);  // freed by the user's code
  w.add(TraceAction::kAlloc, 0x1000, 512, 1);
  SnapshotEventsInput in = stacks_said();
  in.stack_phase.push_back("zero_grad");
  in.stack_place.push_back("");
  in.live_at_dump = {{0x7000, 32 * MiB, 1}, {0x8000, 32 * MiB, 0}, {0x1000, 512, 1}};
  const SnapshotEvents e = snapshot_events(w.t, in);
  ASSERT_EQ(e.pre_existing, 4);
  using S = SpanStart;
  EXPECT_EQ(e.spans, (std::vector<S>{S{0, "other", 1}, S{6, "forward", 1}}));
  EXPECT_EQ(category_of(e, 0), Category::kGradient);
  EXPECT_EQ(category_of(e, 1), Category::kOther);
  EXPECT_EQ(category_of(e, 2), Category::kWorkspace);
  EXPECT_EQ(category_of(e, 3), Category::kWorkspace);
}

// Recording turned on after the model was built: no block from before the
// trace has frames, so a frameless one of cuBLAS's size may be a weight.
TEST(SnapshotEventsTest, BlocksFromBeforeALateTraceWithoutFramesStayOther) {
  TraceWriter w;
  w.add(TraceAction::kAlloc, 0x1000, 512, 1);
  SnapshotEventsInput in = stacks_said();
  in.live_at_dump = {{0x8000, 32 * MiB, 0}, {0x1000, 512, 1}};
  const SnapshotEvents e = snapshot_events(w.t, in);
  ASSERT_EQ(e.pre_existing, 1);
  EXPECT_EQ(category_of(e, 0), Category::kOther);
}

}  // namespace
}  // namespace memfit
