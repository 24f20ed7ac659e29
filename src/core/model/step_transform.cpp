#include "memfit/core/model/step_transform.h"

#include <string>
#include <unordered_map>
#include <vector>

#include "memfit/core/model/report.h"

namespace memfit {

// Note [Steps predicted from a recording]
// Two of advise's rows change no kernel of the step, only how long some of
// its allocations live, so they follow from the plain step's recording
// without running anything:
// - zero_grad(set_to_none=False): the first backward makes the gradients as
//   the plain step does (there are none to add into yet); zero_grad then
//   zeroes them instead of freeing them, so they stay live; each later
//   backward's gradient is made as before and added into the kept one
//   (AccumulateGrad's in-place add, run as soon as the autograd node that
//   made it returns: the engine runs AccumulateGrad before other ready
//   nodes), then freed. The prediction drops the frees of the first
//   backward's gradients and frees each later gradient before the next
//   allocation of another node (events carry the outermost frame, which in
//   backward is the node). A Linear's AddmmBackward makes the bias's
//   gradient (a sum) before its two matrix products, and an LSTM's backward
//   all its layer's gradients: they live until the node returns, not until
//   the next op (freed there, a mlp with momentum came out 2,048 B under).
//   Where events carry no frame, the next allocation of another op. A
//   gradient is an allocation of a backward that a zero_grad frees (or that
//   is never freed).
// - The optimizer's state and step on the host (HostOffloadOptimizer,
//   memfit.offload): the step allocates nothing on the device, so every
//   allocation of an optimizer_step phase, and its free, is dropped.
// Everything else, the times included, is the recording's own. The result
// is a Timeline read like a recorded one (make_report, the caching
// allocator's replay), and it is a prediction: advise marks such rows "~",
// records the plan it chooses, and bench/advise_predicted_rows.py measures
// the error against the same rows recorded.

namespace {

enum class Action : uint8_t {
  kKeep,
  kDrop,
};

// `t` again, event by event as `act` says, with the same phases, and the
// allocations listed in free_before[j] freed just before event j (j may be
// the end). Each allocation gets an id of its own (its index + 1), so a
// free dropped here never meets a reused id.
Timeline rebuild(const Timeline& t, const std::vector<Action>& act,
                 const std::vector<std::vector<size_t>>& free_before = {}) {
  Timeline out;
  const auto& ev = t.events();
  const auto& spans = t.phase_spans();
  std::unordered_map<uint32_t, uint32_t> phases, modules, ops;
  auto mapped = [](std::unordered_map<uint32_t, uint32_t>& m, uint32_t old, auto&& intern) {
    auto it = m.find(old);
    if (it == m.end()) it = m.emplace(old, intern(old)).first;
    return it->second;
  };
  out.reserve(ev.size());
  size_t s = 0;
  bool open = false;
  size_t open_end = 0;
  for (size_t i = 0; i <= ev.size(); ++i) {
    if (open && open_end <= i) {
      out.end_phase();
      open = false;
    }
    for (; s < spans.size() && spans[s].first_event <= i; ++s) {
      out.begin_phase(t.phase_name(spans[s].phase), spans[s].iteration);
      open = true;
      open_end = spans[s].end_event;
    }
    if (i < free_before.size()) {
      for (size_t a : free_before[i]) {
        Event f = ev[i < ev.size() ? i : ev.size() - 1];
        f.kind = EventKind::kFree;
        f.id = a + 1;
        f.phase = out.current_phase();
        f.module = 0;
        f.op = 0;
        out.record(f);
      }
    }
    if (i == ev.size()) break;
    if (act[i] == Action::kDrop) continue;
    Event e = ev[i];
    e.phase = static_cast<uint16_t>(mapped(phases, e.phase, [&](uint32_t p) -> uint32_t {
      return out.phase_index(t.phase_name(static_cast<uint16_t>(p)));
    }));
    e.module = mapped(modules, e.module,
                      [&](uint32_t m) { return out.module_index(t.module_name(m)); });
    e.op = mapped(ops, e.op, [&](uint32_t o) { return out.op_index(t.op_name(o)); });
    e.id = (e.kind == EventKind::kAlloc ? i : t.partner(i)) + 1;
    out.record(e);
  }
  return out;
}

bool named(const Timeline& t, const PhaseSpan& s, const char* name) {
  return t.phase_name(s.phase) == name;
}

}  // namespace

std::optional<Timeline> with_gradients_kept(const Timeline& t) {
  const auto& ev = t.events();
  std::vector<Action> act(ev.size(), Action::kKeep);
  std::vector<std::vector<size_t>> free_before(ev.size() + 1);
  bool first = true;
  bool any = false;
  for (const PhaseSpan& s : t.phase_spans()) {
    if (!named(t, s, kPhaseBackward)) continue;
    bool found = false;
    for (size_t i = s.first_event; i < s.end_event; ++i) {
      if (ev[i].kind != EventKind::kAlloc || ev[i].category != Category::kGradient) continue;
      const size_t f = t.partner(i);
      if (f != kNoEvent && t.phase_name(ev[f].phase) != kPhaseZeroGrad) continue;
      found = true;
      if (f != kNoEvent) act[f] = Action::kDrop;
      if (first) continue;
      // Added into the kept gradient once the node that made it returns:
      // the next allocation by another node (or op, without frames).
      auto another = [&](const Event& e) {
        return ev[i].frame != 0 ? e.frame != ev[i].frame : e.op != ev[i].op;
      };
      size_t j = i + 1;
      while (j < s.end_event && !(ev[j].kind == EventKind::kAlloc && another(ev[j]))) ++j;
      free_before[j].push_back(i);
    }
    any = any || found;
    if (found) first = false;
  }
  if (!any) return std::nullopt;
  return rebuild(t, act, free_before);
}

std::optional<Timeline> with_state_on_host(const Timeline& t) {
  const auto& ev = t.events();
  std::vector<Action> act(ev.size(), Action::kKeep);
  bool any = false;
  for (const PhaseSpan& s : t.phase_spans()) {
    if (!named(t, s, kPhaseOptimizerStep)) continue;
    any = true;
    for (size_t i = s.first_event; i < s.end_event; ++i) {
      if (ev[i].kind != EventKind::kAlloc) continue;
      act[i] = Action::kDrop;
      if (t.partner(i) != kNoEvent) act[t.partner(i)] = Action::kDrop;
    }
  }
  if (!any) return std::nullopt;
  return rebuild(t, act);
}

int64_t batch_independent_at_peak(const Timeline& t) {
  const Timeline::Peak p = t.peak();
  if (p.event_index == kNoEvent) return 0;
  const auto& ev = t.events();
  // The iteration of each event, 0 outside every phase.
  std::vector<int> iteration(ev.size(), 0);
  for (const PhaseSpan& s : t.phase_spans()) {
    for (size_t i = s.first_event; i < s.end_event && i < ev.size(); ++i) iteration[i] = s.iteration;
  }
  const int at_peak = iteration[p.event_index];
  int64_t bytes = 0;
  for (size_t i = 0; i <= p.event_index; ++i) {
    if (ev[i].kind != EventKind::kAlloc) continue;
    const size_t f = t.partner(i);
    if (f != kNoEvent && f <= p.event_index) continue;
    const Category c = ev[i].category;
    if (c == Category::kParameter || c == Category::kBuffer ||
        ((c == Category::kGradient || c == Category::kOptimizerState) && iteration[i] > 0 &&
         iteration[i] < at_peak)) {
      bytes += ev[i].bytes;
    }
  }
  return bytes;
}

}  // namespace memfit
