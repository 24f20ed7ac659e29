#include "memfit/core/model/data_parallel.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <utility>

namespace memfit {

// Note [One rank's memory under data parallelism]
// Each rank runs the single-process step on its local batch; what differs
// is held on top of it or divided by the world size W. One pass over the
// single-process timeline keeps, at every event, the live bytes of four
// kinds, and applies per event (the peak is the largest value):
//   P   parameters;
//   G_t parameter gradients: allocated in backward and outliving it (what
//       a backward allocates and frees inside itself is activations'
//       gradients, which every rank has in full);
//   S   optimizer state;
//   T   optimizer-step temporaries: the step's other allocations. Kept
//       whole: torch's default (for-loop) Adam needs them for one parameter
//       at a time, and the largest parameter may be this rank's. With
//       foreach=True they shrink with the shard: the estimate is then high
//       by up to T(1 - 1/W).
// G is the trainable parameters' bytes (given), B = min(bucket_cap, G).
//   ddp   live + G. DDP allocates its buckets (one copy of the gradients)
//         when wrapping and keeps them. Measured on torch 1.13 with gloo:
//         exactly G more than one process at every phase. With
//         gradient_as_bucket_view, .grad are views into the buckets:
//         live - G_t + G, plus a new gradient for the instant between its
//         op and the reducer's copy into the bucket.
//   zero1 ddp - S(1 - f): the optimizer state sharded; f = 1/W for flat
//         shards, the fullest rank's share for torch's
//         ZeroRedundancyOptimizer, which deals whole parameters (measured:
//         within 0.1% of its fullest rank on an MLP).
//   zero2 live - S(1 - f) - G_t(1 - 1/W) + B: gradients reduce-scattered a
//         bucket at a time as backward makes them, no DDP buckets.
//   zero3 zero2 - P(1 - 1/W) + 2L in forward and loss (the unit computing
//         and the one prefetched, L = largest_unit_bytes), 3L in backward
//         (plus that unit's unsharded gradients before reduce-scatter).
// Shards are rounded up (ceil(x / W)): frameworks pad to equal shards.
// Wrapping a model in DDP also has its own peak, before the first step: its
// parameters broadcast from rank 0 as flat copies of up to
// broadcast_bucket_bytes, freed before the buckets are allocated:
//   P_live + max(min(P, broadcast_bucket_bytes), G) at the end of
//   "parameters" (ddp and zero1 only).
// zero2 and zero3 are formulas for DeepSpeed/FSDP and were not measured on a
// run here (torch 1.13's FSDP needs CUDA); ddp and zero1 are checked against
// real runs (python/tests/test_data_parallel_memory.py).

std::string_view to_string(Sharding s) {
  switch (s) {
    case Sharding::kDdp: return "ddp";
    case Sharding::kZero1: return "zero1";
    case Sharding::kZero2: return "zero2";
    case Sharding::kZero3: return "zero3";
    case Sharding::kFsdp2: return "fsdp2";
  }
  return "?";
}

Sharding sharding_from_string(std::string_view name) {
  for (int i = 0; i <= static_cast<int>(Sharding::kFsdp2); ++i) {
    const auto s = static_cast<Sharding>(i);
    if (name == to_string(s)) return s;
  }
  if (name == "fsdp") return Sharding::kZero3;
  throw std::invalid_argument("[sharding] unknown sharding '" + std::string(name) +
                              "': use ddp, zero1, zero2, zero3 (or fsdp), fsdp2");
}

namespace {

// kStepTemp: the optimizer step's own allocations (on the host under
// FSDP2's CPU offload); every other sharding counts them with kRest.
enum MemoryKind : uint8_t { kParam, kParamGrad, kState, kRest, kStepTemp, kNumKinds };

int64_t ceil_div(int64_t x, int64_t w) { return (x + w - 1) / w; }
int64_t sharded_away(int64_t x, int64_t w) { return x - ceil_div(x, w); }

std::string share(const DataParallelSetup& d) {
  if (d.optimizer_shard_fraction <= 0) return "1/W";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3f (fullest rank's share)", d.optimizer_shard_fraction);
  return buf;
}

std::string formula_of(Sharding s, const DataParallelSetup& d) {
  switch (s) {
    case Sharding::kDdp:
      return d.gradient_as_bucket_view
                 ? "live - gradients + G (gradients are views of DDP's buckets)"
                 : "live + G (DDP's gradient buckets: one copy of the gradients)";
    case Sharding::kZero1:
      return "ddp - optimizer state x (1 - f), f = " + share(d);
    case Sharding::kZero2:
      return "live - optimizer state x (1 - f) - gradients x (1 - 1/W) + one bucket"
             ", f = " + share(d);
    case Sharding::kZero3:
      return d.largest_unit_bytes > 0
                 ? "zero2 - parameters x (1 - 1/W) + 2L forward, 3L backward"
                   " (L: largest unit's parameters)"
                 : "zero2 - parameters x (1 - 1/W) (largest unit unknown: no "
                   "gathered unit counted)";
    case Sharding::kFsdp2: break;
  }
  return "";
}

// Each event's phase span; nullptr for an event outside every span.
std::vector<const PhaseSpan*> span_of_events(const Timeline& t) {
  std::vector<const PhaseSpan*> span_of(t.size(), nullptr);
  for (const PhaseSpan& s : t.phase_spans()) {
    for (size_t i = s.first_event; i < s.end_event && i < t.size(); ++i) span_of[i] = &s;
  }
  return span_of;
}

// Which kind each allocation event is; frees get their allocation's kind.
std::vector<MemoryKind> classify(const Timeline& t, const std::vector<const PhaseSpan*>& span_of) {
  const auto& ev = t.events();
  std::vector<MemoryKind> kind(ev.size(), kRest);
  for (size_t i = 0; i < ev.size(); ++i) {
    const Event& e = ev[i];
    const size_t partner = t.partner(i);
    if (e.kind == EventKind::kFree) {
      if (partner != kNoEvent) kind[i] = kind[partner];
      continue;
    }
    if (e.category == Category::kParameter) {
      kind[i] = kParam;
    } else if (e.category == Category::kOptimizerState) {
      kind[i] = kState;
    } else if (e.category == Category::kGradient && span_of[i] != nullptr &&
               t.phase_name(span_of[i]->phase) == "backward" &&
               (partner == kNoEvent || partner >= span_of[i]->end_event)) {
      kind[i] = kParamGrad;  // outlives the backward that made it
    } else if (span_of[i] != nullptr &&
               t.phase_name(span_of[i]->phase) == "optimizer_step") {
      kind[i] = kStepTemp;
    }
  }
  return kind;
}

// Note [Gradients the reducer has not yet moved]
// With gradient_as_bucket_view (and ZeRO-2's per-bucket reduce) a new
// gradient lives beside its bucket until autograd's AccumulateGrad hands it
// to the reducer, which copies it in and drops it. That happens once the
// backward node that made it returns, so every gradient a node makes is
// live at once until then: a Linear's weight and bias gradients, and all
// four of an LSTM layer's, made by one mkldnn_rnn_layer_backward beside its
// 4 MiB workspace (counting one gradient at a time was 3.34% low there,
// bench/data_parallel_memory.py). The timeline has no node boundaries, so
// gradients made one after another, and anything else their op allocates,
// count as arriving until another op allocates something that is not a
// gradient, or backward ends. Allocations of no known op (op 0) keep the
// old rule: one gradient at a time.
class ArrivingGradients {
 public:
  void add(const Event& e, MemoryKind kind, bool in_backward) {
    if (!in_backward) {
      bytes_ = 0;
      last_was_grad_ = false;
      return;
    }
    if (e.kind == EventKind::kFree) {
      if (kind == kParamGrad) bytes_ = std::max<int64_t>(0, bytes_ - e.bytes);
      return;
    }
    if (kind == kParamGrad) {
      if (e.op == 0 || (!last_was_grad_ && e.op != op_)) bytes_ = 0;
      bytes_ += e.bytes;
      op_ = e.op;
    } else if (e.op == 0 || e.op != op_) {
      bytes_ = 0;
    }
    last_was_grad_ = kind == kParamGrad;
  }
  int64_t bytes() const { return bytes_; }

 private:
  int64_t bytes_ = 0;
  uint32_t op_ = 0;  // the op of the latest gradient
  bool last_was_grad_ = false;
};

}  // namespace

std::vector<RankPeak> per_rank_peaks(const Timeline& t, const DataParallelSetup& d) {
  if (d.world_size < 1) {
    throw std::invalid_argument("[per_rank_peaks] world_size must be >= 1 ranks, got " +
                                std::to_string(d.world_size));
  }
  if (d.gradient_bytes < 0 || d.bucket_cap_bytes < 0 || d.broadcast_bucket_bytes < 0 ||
      d.largest_unit_bytes < 0 || d.optimizer_shard_fraction < 0 ||
      d.optimizer_shard_fraction > 1) {
    throw std::invalid_argument(
        "[per_rank_peaks] the setup's byte counts (gradient_bytes, bucket_cap_bytes, "
        "broadcast_bucket_bytes, largest_unit_bytes) must be >= 0 and "
        "optimizer_shard_fraction in [0, 1]");
  }
  const int64_t W = d.world_size;
  const int64_t G = d.gradient_bytes;
  const int64_t L = d.largest_unit_bytes;
  const int64_t bucket = std::min(d.bucket_cap_bytes, G);

  std::vector<RankPeak> out(kNumShardings);
  for (int s = 0; s < kNumShardings; ++s) {
    out[s].sharding = static_cast<Sharding>(s);
    out[s].formula = formula_of(out[s].sharding, d);
  }
  auto offer = [&](int s, int64_t bytes, const std::string& phase, int iteration) {
    if (bytes > out[s].peak_bytes || out[s].phase.empty()) {
      out[s].peak_bytes = bytes;
      out[s].phase = phase;
      out[s].iteration = iteration;
    }
  };

  const auto& ev = t.events();
  const std::vector<const PhaseSpan*> span_of = span_of_events(t);
  const std::vector<MemoryKind> kind = classify(t, span_of);
  std::array<int64_t, kNumKinds> live_by{};
  int64_t live = 0;
  ArrivingGradients arriving;
  const PhaseSpan* previous = nullptr;
  auto close_span = [&](const PhaseSpan* s) {
    // DDP(model) runs once the parameters are on the device.
    if (s == nullptr || t.phase_name(s->phase) != "parameters") return;
    const int64_t construction =
        live + std::max(std::min(live_by[kParam], d.broadcast_bucket_bytes), G);
    offer(static_cast<int>(Sharding::kDdp), construction, "ddp_construction", 0);
    offer(static_cast<int>(Sharding::kZero1), construction, "ddp_construction", 0);
  };

  for (size_t i = 0; i < ev.size(); ++i) {
    if (span_of[i] != previous) {
      close_span(previous);
      previous = span_of[i];
    }
    const Event& e = ev[i];
    const int64_t signed_bytes = e.kind == EventKind::kAlloc ? e.bytes : -e.bytes;
    live += signed_bytes;
    live_by[kind[i]] += signed_bytes;

    static const std::string kNone;
    const std::string& phase = span_of[i] ? t.phase_name(span_of[i]->phase) : kNone;
    const int iteration = span_of[i] ? span_of[i]->iteration : 0;
    // See Note [Gradients the reducer has not yet moved].
    arriving.add(e, kind[i], phase == "backward");
    const int64_t grads = live_by[kParamGrad];
    const int64_t state = live_by[kState];
    const int64_t step_sharded =
        d.optimizer_shard_fraction > 0
            ? state - static_cast<int64_t>(std::ceil(state * d.optimizer_shard_fraction))
            : sharded_away(state, W);

    const int64_t ddp =
        d.gradient_as_bucket_view ? live - grads + arriving.bytes() + G : live + G;
    // See Note [A rank's optimizer step deals parameters in another order].
    const int64_t reorder = phase == "optimizer_step" ? d.step_reorder_bytes : 0;
    const int64_t zero1 = ddp - step_sharded + reorder;
    const int64_t zero2 =
        live - step_sharded - grads + ceil_div(grads, W) + arriving.bytes() + bucket + reorder;
    int64_t gathered = 0;
    if (phase == "forward" || phase == "loss") gathered = 2 * L;
    if (phase == "backward") gathered = 3 * L;
    const int64_t zero3 = zero2 - sharded_away(live_by[kParam], W) + gathered;

    offer(0, ddp, phase, iteration);
    offer(1, zero1, phase, iteration);
    offer(2, zero2, phase, iteration);
    offer(3, zero3, phase, iteration);
  }
  close_span(previous);
  return out;
}

double largest_partition_fraction(std::vector<int64_t> param_bytes, int world_size,
                                  int64_t per_parameter_bytes) {
  if (world_size < 1) {
    throw std::invalid_argument("[largest_partition_fraction] world_size must be >= 1 ranks, "
                                "got " + std::to_string(world_size));
  }
  if (per_parameter_bytes < 0) {
    throw std::invalid_argument("[largest_partition_fraction] per_parameter_bytes must be >= 0, "
                                "got " + std::to_string(per_parameter_bytes));
  }
  int64_t total = 0;
  for (int64_t b : param_bytes) {
    if (b < 0) {
      throw std::invalid_argument("[largest_partition_fraction] parameter sizes must be >= 0 "
                                  "bytes, got " + std::to_string(b));
    }
    total += b;
  }
  if (total == 0) return 1.0 / world_size;
  std::sort(param_bytes.begin(), param_bytes.end(), std::greater<>());
  std::vector<int64_t> load(static_cast<size_t>(world_size), 0);
  std::vector<int64_t> count(static_cast<size_t>(world_size), 0);
  for (int64_t b : param_bytes) {
    const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += b;
    ++count[r];
  }
  // Each rank's share of bytes, and of bytes + k per parameter: a state of
  // a x bytes + c per parameter lies between the two for any k >= c / a.
  const int64_t k = per_parameter_bytes;
  const auto n = static_cast<int64_t>(param_bytes.size());
  double share = 0;
  for (size_t r = 0; r < load.size(); ++r) {
    share = std::max(share, static_cast<double>(load[r]) / static_cast<double>(total));
    share = std::max(share, static_cast<double>(load[r] + k * count[r]) /
                                static_cast<double>(total + k * n));
  }
  return share;
}

namespace {

// The largest (previous + 2 x current) over neighbouring parameters.
int64_t step_pair_peak(const std::vector<int64_t>& order) {
  int64_t best = 0, previous = 0;
  for (int64_t b : order) {
    best = std::max(best, previous + 2 * b);
    previous = b;
  }
  return best;
}

}  // namespace

int64_t step_reorder_bytes(const std::vector<int64_t>& param_bytes, int world_size) {
  if (world_size < 1) {
    throw std::invalid_argument("[step_reorder_bytes] world_size must be >= 1 ranks, got " +
                                std::to_string(world_size));
  }
  if (world_size == 1) return 0;
  std::vector<int64_t> sorted = param_bytes;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  std::vector<std::vector<int64_t>> ranks(static_cast<size_t>(world_size));
  std::vector<int64_t> load(static_cast<size_t>(world_size), 0);
  for (int64_t b : sorted) {
    const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    ranks[r].push_back(b);
    load[r] += b;
  }
  int64_t worst = 0;
  for (const auto& order : ranks) worst = std::max(worst, step_pair_peak(order));
  return std::max<int64_t>(0, worst - step_pair_peak(param_bytes));
}

RankPeak per_rank_peak(const Timeline& t, const DataParallelSetup& d, Sharding s) {
  return per_rank_peaks(t, d)[static_cast<size_t>(s)];
}

// Note [One rank's memory under FSDP2]
// torch's fully_shard (FSDP2, torch 2.x; read in
// torch/distributed/fsdp/_fully_shard and measured with gloo on 2 CPU
// ranks, bench/fsdp2_gloo.py) keeps each parameter as a DTensor sharded on
// dim 0, padded to a multiple of W. Per unit (one fully_shard call), on
// the single-process timeline's live bytes:
//   P, S, G  sharded: x s = (sum of padded shards) / (parameter bytes).
//            Gradients become sharded per unit as its reduce-scatter ends;
//            until then the current unit's (and the root's, reduced last)
//            are whole, in the param dtype (grad_scale): c of them.
//   forward  a unit's all-gather output (flat, W x shard) is held until
//            the next unit's copy-out; the unsharded parameters are copied
//            out of it and freed after the unit's forward (reshard after
//            forward); gloo's all-gather makes one more output-sized
//            temporary. Worst gathering instant: g[k-1] + 2 g[k] (+ the
//            shard's cast or host copy). The root stays gathered: gR.
//   backward unit k runs with its parameters g[k], the next unit's
//            all-gather prefetched g[k-1] (+ gloo's temporary while it is
//            made), and the reduce-scatter input of the unit before, r[k+1],
//            held until k's own reduce-scatter; then k's reduce-scatter
//            input, gloo's copy of it, and its output r[k]/W (cast to the
//            parameters' dtype if the reduce dtype differs).
// Which unit a backward event belongs to is not recorded, so every event
// takes the worst unit (the largest value over k): exact for equal units,
// high otherwise. Activations are the single process's: with a
// mixed-precision param_dtype they are smaller on the rank (high again).
// CPU offload moves P, S, sharded G and the optimizer step's temporaries to
// the host (RankPeak::host_bytes); the device keeps the rest.

namespace {

struct Fsdp2Terms {
  int64_t gathered = 0;  // X: buffers on top of the sharded state
  int64_t whole = 0;     // c's cap: the gradients still unsharded
};

// The gathering and reducing instants of forward and backward (see the
// Note), each with the gradients it may hold whole.
struct Fsdp2Instants {
  std::vector<Fsdp2Terms> forward, backward;
};

Fsdp2Instants fsdp2_instants(const Fsdp2Setup& d) {
  const int64_t W = d.world_size;
  Fsdp2Unit root;
  std::vector<const Fsdp2Unit*> units;
  for (const Fsdp2Unit& u : d.units) {
    if (u.path.empty()) root = u;
    else units.push_back(&u);
  }
  const int64_t gR = root.gathered_bytes;
  const int64_t rootP = root.param_bytes;
  Fsdp2Instants in;
  in.forward.push_back({2 * gR + root.gather_input_bytes, 0});
  const size_t n = units.size();
  auto g = [&](size_t k) { return k < n ? units[k]->gathered_bytes : 0; };
  auto r = [&](size_t k) { return k < n ? units[k]->reduce_bytes : 0; };
  for (size_t k = 0; k < n; ++k) {
    const Fsdp2Unit& u = *units[k];
    const int64_t before = k == 0 ? gR : g(k - 1);
    in.forward.push_back({gR + before + 2 * u.gathered_bytes + u.gather_input_bytes, 0});
    // Backward runs k = n-1 .. 0: prefetches k-1 (none for the first unit:
    // the root is still gathered), holds k+1's reduce-scatter input.
    const int64_t prefetch = k == 0 ? 0 : g(k - 1);
    const int64_t prefetch_input = k == 0 ? 0 : units[k - 1]->gather_input_bytes;
    const int64_t held = r(k + 1);
    in.backward.push_back({gR + u.gathered_bytes + held + 2 * prefetch + prefetch_input, rootP});
    in.backward.push_back({gR + u.gathered_bytes + held + prefetch, rootP + u.param_bytes});
    in.backward.push_back(
        {gR + prefetch + 2 * u.reduce_bytes + ceil_div(u.reduce_bytes, W) + u.grad_cast_bytes,
         rootP + u.param_bytes});
  }
  in.backward.push_back({gR + 2 * root.reduce_bytes + ceil_div(root.reduce_bytes, W) +
                             root.grad_cast_bytes, rootP});
  return in;
}

void check_fsdp2_setup(const Fsdp2Setup& d) {
  if (d.world_size < 1) {
    throw std::invalid_argument("[fsdp2_rank_peak] world_size must be >= 1 ranks, got " +
                                std::to_string(d.world_size));
  }
  if (d.units.empty()) {
    throw std::invalid_argument(
        "[fsdp2_rank_peak] no units: give the modules fully_shard wraps, the root included");
  }
  for (const Fsdp2Unit& u : d.units) {
    if (u.param_bytes < 0 || u.shard_bytes < 0 || u.gathered_bytes < 0 ||
        u.reduce_bytes < 0 || u.gather_input_bytes < 0 || u.grad_cast_bytes < 0) {
      throw std::invalid_argument("[fsdp2_rank_peak] unit '" + u.path +
                                  "' has a negative byte count: give sizes >= 0");
    }
  }
  if (!(d.grad_scale > 0 && d.grad_scale <= 1)) {
    throw std::invalid_argument(
        "[fsdp2_rank_peak] grad_scale must be in (0, 1] (the param dtype's bytes over the "
        "recorded gradients'), got " + std::to_string(d.grad_scale));
  }
}

}  // namespace

Fsdp2Unit fsdp2_unit(std::string path, const std::vector<ParamShape>& params, int world_size,
                     const Fsdp2Precision& precision, bool cpu_offload) {
  if (world_size < 1) {
    throw std::invalid_argument("[fsdp2_unit] world_size must be >= 1 ranks, got " +
                                std::to_string(world_size));
  }
  if (precision.param_dtype_size < 0 || precision.reduce_dtype_size < 0) {
    throw std::invalid_argument(
        "[fsdp2_unit] dtype sizes must be >= 0 bytes (0: the parameter's own), got " +
        std::to_string(precision.param_dtype_size) + " and " +
        std::to_string(precision.reduce_dtype_size));
  }
  const int64_t W = world_size;
  Fsdp2Unit u;
  u.path = std::move(path);
  for (const ParamShape& p : params) {
    if (p.rows < 0 || p.numel < 0 || p.element_size < 1 ||
        (p.rows == 0 ? p.numel != 0 : p.numel % p.rows != 0)) {
      throw std::invalid_argument(
          "[fsdp2_unit] unit '" + u.path + "' has a parameter of " + std::to_string(p.rows) +
          " rows, " + std::to_string(p.numel) + " elements of " +
          std::to_string(p.element_size) + " bytes: give rows dividing the elements, sizes >= 1");
    }
    // This rank's elements: dim 0 padded to a multiple of W, 1/W of it.
    const int64_t shard = p.rows == 0 ? 0 : ceil_div(p.rows, W) * (p.numel / p.rows);
    const int64_t own = p.element_size;
    const int64_t low = precision.param_dtype_size > 0 ? precision.param_dtype_size : own;
    const int64_t reduce = precision.reduce_dtype_size > 0 ? precision.reduce_dtype_size : low;
    const bool cast = precision.param_dtype_size > 0 && p.cast_to_param_dtype;
    u.param_bytes += p.numel * own;
    u.shard_bytes += shard * own;
    u.gathered_bytes += W * shard * low;
    u.reduce_bytes += W * shard * reduce;
    // The shard is copied before its all-gather: to the device, then cast.
    u.gather_input_bytes += (cpu_offload ? shard * own : 0) + (cast ? shard * low : 0);
    u.grad_cast_bytes += reduce != own ? shard * own : 0;
  }
  return u;
}

double fsdp2_grad_scale(const std::vector<ParamShape>& params, const Fsdp2Precision& precision) {
  if (precision.param_dtype_size <= 0) return 1.0;
  int64_t widest = 0;
  for (const ParamShape& p : params) widest = std::max<int64_t>(widest, p.element_size);
  if (widest == 0) widest = 1;
  return std::min(1.0, static_cast<double>(precision.param_dtype_size) /
                           static_cast<double>(widest));
}

RankPeak fsdp2_rank_peak(const Timeline& t, const Fsdp2Setup& d) {
  check_fsdp2_setup(d);
  int64_t param_total = 0, shard_total = 0;
  for (const Fsdp2Unit& u : d.units) {
    param_total += u.param_bytes;
    shard_total += u.shard_bytes;
  }
  // x bytes of the single process held as this rank's padded shards.
  auto shard = [&](int64_t x) {
    if (param_total == 0) return ceil_div(x, d.world_size);
    return static_cast<int64_t>(std::ceil(static_cast<double>(x) * shard_total / param_total));
  };
  const Fsdp2Instants instants = fsdp2_instants(d);
  static const std::vector<Fsdp2Terms> kNoInstant{{0, 0}};

  RankPeak out;
  out.sharding = Sharding::kFsdp2;
  out.formula = std::string(d.cpu_offload ? "device: " : "") +
                "activations + gathered units (forward g[k-1] + 2g[k], backward g[k] + "
                "prefetch + held reduce-scatter)" +
                (d.cpu_offload ? "; host: parameters, gradients, optimizer state x s"
                               : " + parameters, gradients, optimizer state x s") +
                ", s: padded shard (Note [One rank's memory under FSDP2])";
  const auto& ev = t.events();
  const std::vector<const PhaseSpan*> span_of = span_of_events(t);
  const std::vector<MemoryKind> kind = classify(t, span_of);
  std::array<int64_t, kNumKinds> live_by{};
  int64_t live = 0;
  bool first = true;
  for (size_t i = 0; i < ev.size(); ++i) {
    const Event& e = ev[i];
    const int64_t signed_bytes = e.kind == EventKind::kAlloc ? e.bytes : -e.bytes;
    live += signed_bytes;
    live_by[kind[i]] += signed_bytes;

    static const std::string kNone;
    const std::string& phase = span_of[i] ? t.phase_name(span_of[i]->phase) : kNone;
    const std::vector<Fsdp2Terms>& at = phase == "forward" ? instants.forward
                                        : phase == "backward" || phase == "loss"
                                            ? instants.backward
                                            : kNoInstant;
    const int64_t G = live_by[kParamGrad];
    const int64_t steps = d.cpu_offload ? live_by[kStepTemp] : 0;
    const int64_t others = live - live_by[kParam] - live_by[kState] - G - steps;
    const int64_t sharded_state = shard(live_by[kParam]) + shard(live_by[kState]);
    int64_t device = 0, host = 0;
    for (const Fsdp2Terms& x : at) {
      const int64_t whole = std::min(G, x.whole);
      const int64_t whole_bytes =
          static_cast<int64_t>(std::ceil(static_cast<double>(whole) * d.grad_scale));
      const int64_t sharded = sharded_state + shard(G - whole) + steps;
      const int64_t on_device = others + x.gathered + whole_bytes;
      if (d.cpu_offload) {
        device = std::max(device, on_device);
        host = std::max(host, sharded);
      } else {
        device = std::max(device, on_device + sharded);
      }
    }
    if (device > out.peak_bytes || first) {
      out.peak_bytes = device;
      out.phase = phase;
      out.iteration = span_of[i] ? span_of[i]->iteration : 0;
      first = false;
    }
    out.host_bytes = std::max(out.host_bytes, host);
  }
  return out;
}

}  // namespace memfit
