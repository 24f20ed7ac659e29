#include "memfit/core/model/snapshot_events.h"

#include "memfit/core/model/phase_category.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace memfit {

// Note [Allocated and reserved bytes from a trace]
// - Allocated: an "alloc" entry makes `size` bytes live (the bytes asked for,
//   as memory_viz draws them); they die at its "free_requested", where
//   torch's own allocated-bytes counter drops (the block waits for other
//   streams until "free_completed"). Traces recorded with free_requested
//   skipped die at free_completed.
// - Reserved: the running sum of segment_alloc - segment_free (and, with
//   expandable segments, segment_map - segment_unmap), starting from what
//   was reserved when recording began: the segments at the dump minus the
//   trace's net change.
// - Recording may start after the program allocated (or a ring buffer of
//   max_entries may have dropped the oldest entries): frees of blocks never
//   allocated in the trace, and blocks live at the dump that the trace never
//   allocated, were live at its start. They are counted from the first event
//   (so the allocated peak is still a lower bound of the truth, and said to
//   be).

// Note [Workspaces in a snapshot]
// cuBLAS keeps a workspace per (handle, stream) and a handle per thread,
// allocated through the caching allocator at the thread's first matmul and
// never freed: 32 MiB on Hopper, 8 MiB + 128 KiB on older cards, and
// cuBLASLt's 1 MiB beside it (Note [cuBLAS workspaces on the card],
// report.h). In a trace they are blocks of those sizes that the forward (the
// caller's thread) or the backward (autograd's thread, with no Python frame)
// allocates and the trace never frees. Called gradients, the backward's
// 32 MiB made explain report 13.5x the parameters of gradients and a false
// "gradients kept" on every H200 snapshot. The first block of each size in
// each thread's phases is its workspace; a later one is the step's own.

Timeline timeline_from_events(const EventColumns& ev, const std::vector<std::string>& module_names,
                              const std::vector<SpanStart>& spans) {
  const size_t n = ev.kinds.size();
  if (ev.bytes.size() != n || ev.ids.size() != n || ev.times_ns.size() != n ||
      ev.categories.size() != n || ev.modules.size() != n) {
    throw std::invalid_argument("[timeline_from_events] the event columns differ in length");
  }
  Timeline tl;
  tl.reserve(n);
  std::vector<uint32_t> module_index;
  for (const auto& name : module_names) module_index.push_back(tl.module_index(name));
  size_t next_span = 0;
  for (size_t i = 0; i < n; ++i) {
    while (next_span < spans.size() && std::get<0>(spans[next_span]) <= i) {
      tl.begin_phase(std::get<1>(spans[next_span]), std::get<2>(spans[next_span]));
      ++next_span;
    }
    if (ev.categories[i] >= kNumCategories) {
      throw std::invalid_argument("[timeline_from_events] bad category");
    }
    if (ev.modules[i] >= module_index.size()) {
      throw std::invalid_argument("[timeline_from_events] bad module");
    }
    Event e;
    e.kind = ev.kinds[i] ? EventKind::kFree : EventKind::kAlloc;
    e.bytes = ev.bytes[i];
    e.id = ev.ids[i];
    e.time_ns = ev.times_ns[i];
    e.device = Device::kCUDA;
    e.category = static_cast<Category>(ev.categories[i]);
    e.module = module_index[ev.modules[i]];
    e.phase = tl.current_phase();
    tl.record(e);
  }
  tl.end_phase();
  return tl;
}

const std::vector<int64_t>& snapshot_workspace_sizes() {
  static const std::vector<int64_t> sizes = {32 << 20, (8 << 20) + (128 << 10), 1 << 20};
  return sizes;
}

namespace {

constexpr uint8_t action(TraceAction a) { return static_cast<uint8_t>(a); }

struct Pre {
  uint64_t address;
  int64_t bytes;
  uint32_t stack;  // its free's frames where `freed`, else its allocation's
  bool freed;
};

// Pass 1 (See Note [Allocated and reserved bytes from a trace]): what was
// live before the trace, and the reserved bytes it changed.
struct Before {
  std::vector<Pre> live;
  int64_t net_reserved = 0;
  bool expandable = false;
};

Before live_before(const SnapshotTrace& t, uint8_t free_action,
                   const std::vector<LiveBlock>& at_dump) {
  Before b;
  std::unordered_map<uint64_t, int64_t> live;
  for (size_t i = 0; i < t.size_of(); ++i) {
    const uint8_t a = t.action[i];
    if (a == action(TraceAction::kAlloc)) {
      live[t.addr[i]] = t.size[i];
    } else if (a == free_action) {
      if (live.erase(t.addr[i]) == 0) {
        b.live.push_back({t.addr[i], t.size[i], t.stack[i], true});
      }
    } else if (a == action(TraceAction::kSegmentAlloc) || a == action(TraceAction::kSegmentMap)) {
      b.net_reserved += t.size[i];
      b.expandable |= a == action(TraceAction::kSegmentMap);
    } else if (a == action(TraceAction::kSegmentFree) ||
               a == action(TraceAction::kSegmentUnmap)) {
      b.net_reserved -= t.size[i];
      b.expandable |= a == action(TraceAction::kSegmentUnmap);
    }
  }
  std::unordered_set<uint64_t> freed_before;
  for (const Pre& p : b.live) freed_before.insert(p.address);
  for (const LiveBlock& blk : at_dump) {
    if (!live.count(blk.address) && !freed_before.count(blk.address)) {
      b.live.push_back({blk.address, blk.bytes, blk.stack, false});
    }
  }
  return b;
}

// The phase a block live before the trace was made in (See Note [What was
// live before the trace]): its allocation's frames say it; a free's say
// where it died: zero_grad frees what backward made, backward what forward
// saved; elsewhere (the user's `del`) nothing.
std::string phase_before(const std::string& label, bool freed) {
  if (freed) {
    return label == "zero_grad" ? "backward" : label == "backward" ? "forward" : "other";
  }
  if (label == "user") return "inputs";
  if (label.empty() || label == "zero_grad") return "other";
  return label;
}

// Note [What was live before the trace]
// A trace that starts late (recording turned on after the model was built)
// or whose ring buffer dropped its oldest entries (max_entries) starts with
// blocks it never allocated. They come first, in the dump's order, not the
// program's: spans drawn from their frames made a false iteration ("zero_grad
// +14 MiB, inputs +43 MiB, forward +65 MiB: activations saved for
// backward" on an H200 trace cut to its last 60%, where the 65 MiB were
// cuBLAS's workspaces, and Adam's state and the weights, freed by the
// script's end, "inputs"). So they are one span, "other", and each is
// categorised by the phase its own frames say: where it was made for a
// block live at the dump (parameters, Adam's state, a workspace: one per
// thread and size, as in the trace; one without a Python frame is
// autograd's thread's where other such blocks have frames, the history on
// when they were made), where it died for one the trace frees (zero_grad:
// a gradient; backward: an activation); else "other". Recording turned on
// late leaves every such block without frames: all "other".

// Phase spans from the phase each event's frames say: an undecided event
// takes the phase around it; "user" (only the user's code, a tensor made by
// hand) is the inputs between steps and undecided inside one; an iteration
// begins at a forward after a backward. The first `pre` events, blocks live
// before the trace, are one span of their own (See Note [What was live
// before the trace]).
void find_spans(const std::vector<std::string>& labels, const std::vector<uint8_t>& kinds,
                const std::vector<std::string>& before, SnapshotEvents& out) {
  std::string current;  // "": none yet
  int iteration = 1;
  bool seen_backward = false;
  if (!before.empty()) out.spans.emplace_back(0, "other", 1);
  out.phase_of_alloc = before;
  for (size_t e = before.size(); e < labels.size(); ++e) {
    std::string phase = labels[e];
    if (phase == "user") {
      phase = (current.empty() || current == "parameters" || current == "optimizer_step" ||
               current == "zero_grad")
                  ? "inputs"
                  : "";
    }
    if (!phase.empty() && phase != current) {
      if ((phase == "forward" || phase == "inputs") && seen_backward) {
        ++iteration;
        seen_backward = false;
      }
      if (phase == "backward") seen_backward = true;
      if (current.empty() && out.spans.empty() && e > 0) out.spans.emplace_back(0, "other", 1);
      out.spans.emplace_back(e, phase, phase == "parameters" ? 1 : iteration);
      current = phase;
    }
    if (kinds[e] == 0) out.phase_of_alloc.push_back(current.empty() ? "other" : current);
  }
  if (out.spans.empty()) out.spans.emplace_back(0, "other", 1);
}

// Each allocation's category, from its phase and its lifetime (See Note
// [Allocated and reserved bytes from a trace] for pre-existing ones): freed
// inside its own phase span, a temporary; else what that phase leaves
// (activations after forward and loss, gradients after backward, state
// after the optimizer's step). A library's workspace is its own (See Note
// [Workspaces in a snapshot]). What forward makes and its iteration's
// backward does not free is no activation (a cache, an output the loop
// keeps): other.
// `pre_framed`: a block live before the trace has frames (the history was
// on when it was made: a ring buffer that dropped entries), so one without
// is a C++ thread's, autograd's (See Note [What was live before the trace]).
std::vector<uint8_t> categories(const EventColumns& ev, const SnapshotEvents& out,
                                bool pre_framed) {
  const size_t n = ev.kinds.size();
  constexpr int64_t kNever = -1;
  std::vector<int64_t> free_at(out.stacks.size() + 1, kNever);  // by id: its first free
  for (size_t e = n; e-- > 0;) {
    if (ev.kinds[e] == 1) free_at[ev.ids[e]] = static_cast<int64_t>(e);
  }
  std::vector<int64_t> span_end(n), span_iteration(n);
  std::map<int64_t, int64_t> backward_end;  // iteration -> the end of its backward
  for (size_t k = 0; k < out.spans.size(); ++k) {
    const size_t begin = std::get<0>(out.spans[k]);
    const size_t end = k + 1 < out.spans.size() ? std::get<0>(out.spans[k + 1]) : n;
    const int iteration = std::get<2>(out.spans[k]);
    if (std::get<1>(out.spans[k]) == "backward") backward_end[iteration] = end;
    for (size_t e = begin; e < end; ++e) {
      span_end[e] = end;
      span_iteration[e] = iteration;
    }
  }
  const auto& workspace_sizes = snapshot_workspace_sizes();
  std::set<std::pair<int, int64_t>> workspaces;  // (thread, size) seen
  std::vector<uint8_t> cats;
  cats.reserve(n);
  size_t a = 0;
  for (size_t e = 0; e < n; ++e) {
    Category c = Category::kOther;
    if (ev.kinds[e] == 0) {
      const std::string& phase = out.phase_of_alloc[a++];
      const int64_t f = free_at[ev.ids[e]];
      // The thread that runs a phase: the caller's (1) or autograd's (2).
      const bool before = out.trace_index[e] < 0;
      const int thread = phase == "forward" || phase == "loss"           ? 1
                         : phase == "backward" || (before && pre_framed &&
                                                   phase == "other") ? 2
                                                                     : 0;
      const int64_t bytes = ev.bytes[e];
      if (f == kNever && thread &&
          std::find(workspace_sizes.begin(), workspace_sizes.end(), bytes) !=
              workspace_sizes.end() &&
          workspaces.insert({thread, bytes}).second) {
        c = Category::kWorkspace;
      } else if (phase == "parameters" || phase == "inputs") {
        c = default_category(phase);
      } else if (before) {  // its own frames' phase: See Note [What was live before the trace]
        c = phase == "optimizer_step" || phase == "backward" ? default_category(phase)
            : (phase == "forward" || phase == "loss") && f != kNever ? Category::kActivation
                                                                      : Category::kOther;
      } else if (f != kNever && f < span_end[e]) {
        c = Category::kTemporary;
      } else {
        // Whether it outlives its iteration's backward (never, when the
        // trace has none).
        const auto be = backward_end.find(span_iteration[e]);
        const bool outlives =
            be != backward_end.end() && (f == kNever || f >= be->second);
        c = (phase == "forward" || phase == "loss") && outlives ? Category::kOther
                                                                : default_category(phase);
      }
    }
    cats.push_back(static_cast<uint8_t>(c));
  }
  return cats;
}

}  // namespace

SnapshotEvents snapshot_events(const SnapshotTrace& t, const SnapshotEventsInput& in) {
  const size_t n = t.size_of();
  const size_t stacks = std::min(in.stack_phase.size(), in.stack_place.size());
  auto check_stack = [&](uint32_t sid) {
    if (sid >= stacks) {
      throw std::invalid_argument("[snapshot_events] stack " + std::to_string(sid) +
                                  " has no phase or place: " + std::to_string(stacks) +
                                  " stacks given");
    }
    return sid;
  };
  const uint8_t free_action =
      std::find(t.action.begin(), t.action.end(), action(TraceAction::kFreeRequested)) !=
              t.action.end()
          ? action(TraceAction::kFreeRequested)
          : action(TraceAction::kFreeCompleted);
  const Before before = live_before(t, free_action, in.live_at_dump);

  SnapshotEvents out;
  out.expandable = before.expandable;
  out.reserved_at_start = in.reserved_at_dump - before.net_reserved;
  if (out.reserved_at_start < 0) {
    out.notes.push_back("the segments at the dump hold " + std::to_string(-out.reserved_at_start) +
                        " bytes less than the trace reserved: segments of other memory pools "
                        "are not in the dump");
    out.reserved_at_start = 0;
  }

  // Pass 2: the events, in order, with their phase labels. Allocations live
  // before the trace come first, so their frees in the trace find them.
  EventColumns ev;
  std::vector<std::string> labels;  // per event: the phase its frames say ("": none)
  std::unordered_map<uint64_t, std::pair<size_t, uint32_t>> alloc_of;  // addr -> (event, stack)
  const int64_t t0 = n ? t.time_us[0] : 0;
  int64_t reserved = out.reserved_at_start;
  out.peak_reserved_bytes = reserved;
  auto push = [&](uint8_t kind, int64_t bytes, uint64_t id, int64_t time_ns, int64_t ti) {
    ev.kinds.push_back(kind);
    ev.bytes.push_back(bytes);
    ev.ids.push_back(id);
    ev.times_ns.push_back(time_ns);
    out.trace_index.push_back(ti);
    out.reserved_after.push_back(reserved);
  };
  auto allocate = [&](uint64_t addr, int64_t bytes, uint32_t sid, int64_t ti, int64_t time_ns) {
    alloc_of[addr] = {ev.kinds.size(), sid};
    push(0, bytes, out.stacks.size() + 1, time_ns, ti);
    labels.push_back(in.stack_phase[check_stack(sid)]);
    out.stacks.push_back(sid);
  };
  auto release = [&](size_t j, int64_t ti, int64_t time_ns, std::string label) {
    push(1, ev.bytes[j], ev.ids[j], time_ns, ti);
    labels.push_back(std::move(label));
  };
  std::vector<std::string> phases_before;  // See Note [What was live before the trace]
  bool pre_framed = false;
  for (const Pre& p : before.live) {
    allocate(p.address, p.bytes, p.stack, -1, 0);
    out.allocated_at_start += p.bytes;
    phases_before.push_back(phase_before(labels.back(), p.freed));
    pre_framed |= !p.freed && !labels.back().empty();
  }
  out.pre_existing = static_cast<int64_t>(before.live.size());
  for (size_t i = 0; i < n; ++i) {
    const uint8_t a = t.action[i];
    const int64_t ti = static_cast<int64_t>(i);
    const int64_t time_ns = (t.time_us[i] - t0) * 1000;
    if (a == action(TraceAction::kAlloc)) {
      auto prev = alloc_of.find(t.addr[i]);
      if (prev != alloc_of.end()) {  // a free the trace did not record
        const size_t j = prev->second.first;
        alloc_of.erase(prev);
        release(j, ti, time_ns, "");
      }
      allocate(t.addr[i], t.size[i], t.stack[i], ti, time_ns);
    } else if (a == free_action) {
      auto it = alloc_of.find(t.addr[i]);
      if (it == alloc_of.end()) continue;
      const auto [j, alloc_stack] = it->second;
      alloc_of.erase(it);
      // A free's own frames (context="all") say its phase (zero_grad, ...);
      // frames equal to its allocation's say nothing new.
      const uint32_t sid = t.stack[i];
      release(j, ti, time_ns, sid != alloc_stack ? in.stack_phase[check_stack(sid)] : "");
    } else if (a == action(TraceAction::kSegmentAlloc) || a == action(TraceAction::kSegmentMap)) {
      reserved += t.size[i];
      if (reserved > out.peak_reserved_bytes) {
        out.peak_reserved_bytes = reserved;
        out.peak_reserved_trace_index = ti;
      }
    } else if (a == action(TraceAction::kSegmentFree) ||
               a == action(TraceAction::kSegmentUnmap)) {
      reserved -= t.size[i];
    } else if (a == action(TraceAction::kOom)) {
      out.ooms.push_back({ti, t.size[i], t.addr[i], t.stream[i], t.stack[i],
                          static_cast<int64_t>(ev.kinds.size()), reserved});
    }
  }

  find_spans(labels, ev.kinds, phases_before, out);
  ev.categories = categories(ev, out, pre_framed);
  // Places, numbered as they first appear; 0 is "" (no Python frame says).
  std::vector<std::string> place_names{""};
  std::unordered_map<std::string, uint32_t> place_index{{"", 0}};
  size_t k = 0;
  for (size_t e = 0; e < ev.kinds.size(); ++e) {
    uint32_t m = 0;
    if (ev.kinds[e] == 0) {
      const std::string& name = in.stack_place[out.stacks[k++]];
      auto [it, added] = place_index.emplace(name, static_cast<uint32_t>(place_names.size()));
      if (added) place_names.push_back(name);
      m = it->second;
    }
    ev.modules.push_back(m);
  }
  out.timeline = timeline_from_events(ev, place_names, out.spans);
  if (!before.live.empty()) {
    out.notes.push_back(
        "the trace starts after " + std::to_string(before.live.size()) +
        " allocations were made (" + std::to_string(out.allocated_at_start) +
        " bytes): they are counted live from its start, so the allocated peak is a lower "
        "bound; call torch.cuda.memory._record_memory_history() before the first CUDA "
        "allocation (and with max_entries large enough) for a complete trace");
  }
  return out;
}

}  // namespace memfit
