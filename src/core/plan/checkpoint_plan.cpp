#include "memfit/core/plan/checkpoint_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace memfit {
namespace {

constexpr size_t kMaxFront = 65536;

void check_sizes(const std::vector<ChainSegment>& segments,
                 const std::vector<bool>& checkpointed, const char* op) {
  if (segments.size() != checkpointed.size()) {
    throw std::invalid_argument(
        std::string("[") + op + "] " + std::to_string(checkpointed.size()) +
        " flags for " + std::to_string(segments.size()) + " segments");
  }
}

int64_t kept(const ChainSegment& s, bool checkpointed) {
  return checkpointed ? s.input_bytes : s.activation_bytes;
}

// Live bytes while segment i's backward runs, given the kept bytes before it.
int64_t during_backward(const ChainSegment& s, bool checkpointed,
                        const ChainMemory& m, int64_t prefix) {
  return m.backward_fixed + prefix + (checkpointed ? s.input_bytes : 0) +
         s.activation_bytes + s.backward_extra_bytes;
}

ChainPlan evaluate(std::string rule, std::vector<bool> checkpointed,
                   const std::vector<ChainSegment>& segments,
                   const ChainMemory& memory, int64_t budget) {
  ChainPlan p;
  p.rule = std::move(rule);
  p.predicted_peak = chain_peak(segments, memory, checkpointed);
  p.recompute_ns = chain_recompute_ns(segments, checkpointed);
  p.fits = p.predicted_peak <= budget;
  p.checkpointed = std::move(checkpointed);
  return p;
}

std::string ordinal(int k) {
  const int mod100 = k % 100;
  const char* suffix = "th";
  if (mod100 < 11 || mod100 > 13) {
    if (k % 10 == 1) suffix = "st";
    if (k % 10 == 2) suffix = "nd";
    if (k % 10 == 3) suffix = "rd";
  }
  return std::to_string(k) + suffix;
}

// One state of the dynamic programme: the prefix's kept bytes and recompute
// time, and how it was reached.
struct State {
  int64_t prefix = 0;
  double time = 0;
  int parent = -1;  // index in the previous segment's front
  bool checkpointed = false;
};

// Keeps the states no other state beats on both bytes and time, sorted by
// bytes ascending (so time strictly descending).
std::vector<State> pareto(std::vector<State> states) {
  std::sort(states.begin(), states.end(), [](const State& a, const State& b) {
    return a.prefix != b.prefix ? a.prefix < b.prefix : a.time < b.time;
  });
  std::vector<State> front;
  for (const auto& s : states) {
    if (front.empty() || s.time < front.back().time) front.push_back(s);
  }
  return front;
}

// See Note [The chain's memory model]: merges states onto a grid of kept
// bytes rounded up, keeping the cheapest per cell.
std::vector<State> coarsen(std::vector<State> front) {
  const int64_t top = front.back().prefix;
  const int64_t cell =
      std::max<int64_t>(1, top / static_cast<int64_t>(kMaxFront / 2) + 1);
  for (auto& s : front) s.prefix = (s.prefix + cell - 1) / cell * cell;
  return pareto(std::move(front));
}

}  // namespace

int64_t chain_peak(const std::vector<ChainSegment>& segments,
                   const ChainMemory& memory,
                   const std::vector<bool>& checkpointed) {
  check_sizes(segments, checkpointed, "chain_peak");
  int64_t peak = memory.other_peak;
  int64_t prefix = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    peak = std::max(
        peak, during_backward(segments[i], checkpointed[i], memory, prefix));
    prefix += kept(segments[i], checkpointed[i]);
  }
  return std::max(peak, memory.forward_fixed + prefix);
}

double chain_recompute_ns(const std::vector<ChainSegment>& segments,
                          const std::vector<bool>& checkpointed) {
  check_sizes(segments, checkpointed, "chain_recompute_ns");
  double t = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (checkpointed[i]) t += segments[i].recompute_ns;
  }
  return t;
}

int ChainPlan::count() const {
  return static_cast<int>(
      std::count(checkpointed.begin(), checkpointed.end(), true));
}

std::string checkpoint_indices(const std::vector<bool>& checkpointed) {
  std::string out;
  for (size_t i = 0; i < checkpointed.size(); ++i) {
    if (checkpointed[i]) out += (out.empty() ? "" : ",") + std::to_string(i);
  }
  return out.empty() ? "-" : out;
}

std::string ChainPlan::indices() const { return checkpoint_indices(checkpointed); }

ChainPlan chain_plan_none(const std::vector<ChainSegment>& segments,
                          const ChainMemory& memory, int64_t budget) {
  return evaluate("none", std::vector<bool>(segments.size(), false), segments,
                  memory, budget);
}

ChainPlan chain_plan_every_k(const std::vector<ChainSegment>& segments,
                             const ChainMemory& memory, int64_t budget, int k) {
  if (k < 1) {
    throw std::invalid_argument("[chain_plan_every_k] k must be >= 1, got " +
                                std::to_string(k));
  }
  std::vector<bool> c(segments.size());
  for (size_t i = 0; i < c.size(); ++i) c[i] = i % static_cast<size_t>(k) == 0;
  return evaluate(k == 1 ? "every layer" : "every " + ordinal(k) + " layer",
                  std::move(c), segments, memory, budget);
}

ChainPlan chain_plan_sqrt(const std::vector<ChainSegment>& segments,
                          const ChainMemory& memory, int64_t budget) {
  const size_t n = segments.size();
  const size_t k = std::max<size_t>(
      1, static_cast<size_t>(std::ceil(std::sqrt(static_cast<double>(n)))));
  std::vector<bool> c(n);
  // Keep segments k-1, 2k-1, ...: the last of each group of k.
  for (size_t i = 0; i < n; ++i) c[i] = (i + 1) % k != 0;
  if (k == 1) c.assign(n, false);
  return evaluate("sqrt(n)", std::move(c), segments, memory, budget);
}

ChainPlan chain_plan_optimal(const std::vector<ChainSegment>& segments,
                             const ChainMemory& memory, int64_t budget) {
  const size_t n = segments.size();
  // fronts[i]: the states after deciding segments [0, i).
  std::vector<std::vector<State>> fronts(n + 1);
  fronts[0].push_back(State{});
  bool feasible = memory.other_peak <= budget;
  for (size_t i = 0; i < n && feasible; ++i) {
    std::vector<State> next;
    const auto& front = fronts[i];
    for (size_t s = 0; s < front.size(); ++s) {
      for (bool c : {false, true}) {
        if (during_backward(segments[i], c, memory, front[s].prefix) > budget)
          continue;
        State t;
        t.prefix = front[s].prefix + kept(segments[i], c);
        t.time = front[s].time + (c ? segments[i].recompute_ns : 0.0);
        t.parent = static_cast<int>(s);
        t.checkpointed = c;
        next.push_back(t);
      }
    }
    next = pareto(std::move(next));
    if (next.size() > kMaxFront) next = coarsen(std::move(next));
    feasible = !next.empty();
    fronts[i + 1] = std::move(next);
  }
  int best = -1;
  if (feasible) {
    const auto& last = fronts[n];
    for (size_t s = 0; s < last.size(); ++s) {
      if (memory.forward_fixed + last[s].prefix > budget) continue;
      if (best < 0 || last[s].time < last[static_cast<size_t>(best)].time) {
        best = static_cast<int>(s);
      }
    }
  }
  if (best < 0) {
    // Nothing fits: the least memory is every segment checkpointed whose
    // checkpoint does not cost more than it keeps.
    std::vector<bool> c(n);
    for (size_t i = 0; i < n; ++i)
      c[i] = segments[i].input_bytes < segments[i].activation_bytes;
    // Of the plans with that least peak, the least recompute: where the peak
    // is the optimizer's or one segment's backward, checkpointing more does
    // not lower it and must not be chosen.
    const int64_t least = chain_peak(segments, memory, c);
    if (least > budget) {
      ChainPlan cheapest = chain_plan_optimal(segments, memory, least);
      if (cheapest.fits) c = std::move(cheapest.checkpointed);
    }
    return evaluate("optimal", std::move(c), segments, memory, budget);
  }
  std::vector<bool> c(n);
  int s = best;
  for (size_t i = n; i > 0; --i) {
    const State& st = fronts[i][static_cast<size_t>(s)];
    c[i - 1] = st.checkpointed;
    s = st.parent;
  }
  return evaluate("optimal", std::move(c), segments, memory, budget);
}

std::vector<ChainPlan> compare_chain_plans(
    const std::vector<ChainSegment>& segments, const ChainMemory& memory,
    int64_t budget) {
  std::vector<ChainPlan> out;
  auto add = [&](ChainPlan p) {
    for (const auto& q : out) {
      if (q.checkpointed == p.checkpointed) return;
    }
    out.push_back(std::move(p));
  };
  add(chain_plan_none(segments, memory, budget));
  if (!segments.empty()) add(chain_plan_every_k(segments, memory, budget, 1));
  add(chain_plan_sqrt(segments, memory, budget));
  for (int k = 2; k < static_cast<int>(segments.size()); ++k) {
    add(chain_plan_every_k(segments, memory, budget, k));
  }
  // The optimal plan is listed even when a rule made the same choice.
  out.push_back(chain_plan_optimal(segments, memory, budget));
  return out;
}

}  // namespace memfit
