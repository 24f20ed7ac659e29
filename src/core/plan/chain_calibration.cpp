#include "memfit/core/plan/chain_calibration.h"

#include <algorithm>

namespace memfit {
namespace {

// The index of the last event of the last iteration's forward (the end of
// forward, where saved activations are counted); kNoEvent if none.
size_t forward_end(const Timeline& t) {
  size_t end = kNoEvent;
  for (const auto& span : t.phase_spans()) {
    if (t.phase_name(span.phase) == kPhaseForward &&
        span.end_event > span.first_event) {
      end = span.end_event - 1;
    }
  }
  return end;
}

// Which chain block a module path belongs to; -1 for none. A path may be
// labelled with its class ("layers.0 (Block)", as the Python front end
// labels them): the label ends the path.
int block_of(const std::string& path, const std::vector<std::string>& chain) {
  for (size_t i = 0; i < chain.size(); ++i) {
    const auto& c = chain[i];
    if (path.compare(0, c.size(), c) == 0 &&
        (path.size() == c.size() || path[c.size()] == '.' ||
         path.compare(c.size(), 2, " (") == 0)) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

}  // namespace

std::vector<int64_t> block_activations(const Timeline& t,
                                       const std::vector<std::string>& chain) {
  std::vector<int64_t> bytes(chain.size(), 0);
  const size_t end = forward_end(t);
  if (end == kNoEvent) return bytes;
  for (const auto& [path, b] :
       t.module_bytes_after(end, Category::kActivation)) {
    const int i = block_of(path, chain);
    if (i >= 0) bytes[static_cast<size_t>(i)] += b;
  }
  return bytes;
}

// From the block's first event to the first event after its last one, the
// least over the recorded forwards: a recorded forward is one sample of a
// noisy clock, and noise only adds time (a core taken away for a few
// milliseconds made a 0.3 ms block 60 ms, and the planner's choice follows
// it). Blocks that allocate alike (the same count and bytes of allocations
// in their forward: a stack of identical layers) get their median time:
// identical blocks must tie, or the planner's choice among them follows the
// noise.
std::vector<double> block_forward_ns(const Timeline& t,
                                     const std::vector<std::string>& chain) {
  std::vector<double> ns(chain.size(), 1.0);
  std::vector<bool> seen(chain.size(), false);
  std::vector<std::pair<int64_t, int64_t>> alike(chain.size(), {0, 0});
  const auto& ev = t.events();
  for (const auto& span : t.phase_spans()) {
    if (t.phase_name(span.phase) != kPhaseForward) continue;
    std::vector<size_t> first(chain.size(), kNoEvent), last(chain.size(), kNoEvent);
    std::vector<std::pair<int64_t, int64_t>> counted(chain.size(), {0, 0});
    for (size_t e = span.first_event; e < span.end_event; ++e) {
      const int i = block_of(t.module_name(ev[e].module), chain);
      if (i < 0) continue;
      const auto b = static_cast<size_t>(i);
      if (first[b] == kNoEvent) first[b] = e;
      last[b] = e;
      if (ev[e].kind == EventKind::kAlloc) {
        counted[b].first += 1;
        counted[b].second += ev[e].bytes;
      }
    }
    for (size_t i = 0; i < chain.size(); ++i) {
      if (first[i] == kNoEvent) continue;
      const size_t after = std::min(last[i] + 1, ev.size() - 1);
      const double took = std::max<double>(
          1.0, static_cast<double>(ev[after].time_ns - ev[first[i]].time_ns));
      ns[i] = seen[i] ? std::min(ns[i], took) : took;
      seen[i] = true;
      alike[i] = counted[i];  // the last forward's, as before
    }
  }
  std::vector<double> out = ns;
  for (size_t i = 0; i < chain.size(); ++i) {
    std::vector<double> group;
    for (size_t j = 0; j < chain.size(); ++j) {
      if (alike[j] == alike[i] && seen[j]) group.push_back(ns[j]);
    }
    if (group.size() < 2) continue;
    std::sort(group.begin(), group.end());
    out[i] = group[group.size() / 2];
  }
  return out;
}

namespace {

struct PhasePeaks {
  int64_t forward = 0;  // forward and loss
  int64_t backward = 0;
  int64_t other = 0;
};

PhasePeaks phase_peaks(const Report& report) {
  PhasePeaks out;
  for (const auto& p : report.phases) {
    if (p.name == kPhaseForward || p.name == kPhaseLoss) {
      out.forward = std::max(out.forward, p.peak_bytes);
    } else if (p.name == kPhaseBackward) {
      out.backward = std::max(out.backward, p.peak_bytes);
    } else {
      out.other = std::max(out.other, p.peak_bytes);
    }
  }
  return out;
}

}  // namespace

// Note [Calibrating the chain from two profiles]
// The chain's model (See Note [The chain's memory model]) is filled from a
// plain profile and one with every block checkpointed, at the same batch:
// a block's activation_bytes are what it holds at the end of forward plainly
// minus what it holds checkpointed (its output); its input is kept either
// way in a residual chain (input_bytes 0). other_peak is the largest peak of
// the phases outside forward, loss and backward.
// The backward begins with the loss head's backward, before the chain's:
// everything the chain keeps is alive then, beside the head's transients
// (the logits' gradient). That moment has the form of the end of forward,
// fixed bytes plus every segment's kept bytes, so forward_fixed is the
// larger of the plain forward/loss and backward peaks minus the chain's
// activations. backward_fixed is what stays beside one segment's backward:
// the checkpointed profile's backward peak minus the largest segment's
// activations, never more than the plain one implies. (It was the plain
// backward peak minus the activations: the head's transients counted during
// every segment's backward, and checkpointing every block was predicted
// 18.91 MiB where it measured 15.16 MiB on the demo gpt.) The plan is still
// checked by profiling it, and the budget it is planned for moved by what
// the profile missed or spared.
void calibrate_chain(const Report& plain, const Timeline& plain_timeline,
                     const Report& every, const Timeline& every_timeline,
                     const std::vector<std::string>& chain,
                     const std::vector<double>& ns,
                     std::vector<ChainSegment>& segments, ChainMemory& memory) {
  const auto kept = block_activations(plain_timeline, chain);
  const auto outs = block_activations(every_timeline, chain);
  segments.clear();
  int64_t sum = 0;
  for (size_t i = 0; i < chain.size(); ++i) {
    ChainSegment s;
    s.name = chain[i];
    s.activation_bytes = std::max<int64_t>(0, kept[i] - outs[i]);
    s.recompute_ns = i < ns.size() ? ns[i] : 1.0;
    sum += s.activation_bytes;
    segments.push_back(s);
  }
  int64_t largest = 0;
  for (const auto& s : segments) largest = std::max(largest, s.activation_bytes);
  const PhasePeaks p = phase_peaks(plain);
  const PhasePeaks e = phase_peaks(every);
  memory.forward_fixed = std::max(p.forward, p.backward) - sum;
  memory.backward_fixed =
      std::min(p.backward - sum, std::max<int64_t>(0, e.backward - largest));
  memory.other_peak = p.other;
}

}  // namespace memfit
