// The plan's search of Note [How advise plans]: halving micro-batches, each
// level's checkpointing choices, every plan verified on a real recording.
#include <algorithm>
#include <optional>
#include <stdexcept>

#include "advise_planner.h"
#include "memfit/core/model/units.h"
#include "memfit/core/plan/chain_calibration.h"

namespace memfit::impl {

// Note [Micro-batches of a model that mixes samples]
// BatchNorm in training normalizes with the statistics of the samples it is
// given: a micro-batch gets its own, so a split step computes other
// numbers (and memfit.Trainer refuses to split it unless told). For such a
// model (AdviseSettings::split_changes) the searches that keep the numbers
// stay at the whole batch. With allow_approximate they run again from half
// the batch, before bf16 and the lighter optimizers (which change more: the
// precision or the training itself), and the plan says it changes the
// numbers.
bool Planner::search_plan() {
  whole_only_ = !s_.split_changes.empty() && s_.batch > 1;
  bool found = search_exact();
  if (!found && whole_only_ && s_.allow_approximate) {
    whole_only_ = false;
    from_half_ = true;  // the whole batch's levels were searched above
    found = search_exact();
    from_half_ = false;
  }
  if (!found && s_.allow_approximate) found = search_settings(false);
  if (!found && s_.allow_approximate) {
    std::vector<StepVariant> variants;
    StepVariant bf16;
    bf16.autocast_bf16 = true;
    variants.push_back(bf16);
    for (const auto& o : s_.lighter) {
      StepVariant v;
      v.optimizer = o;
      variants.push_back(v);
      v.autocast_bf16 = true;
      variants.push_back(v);
    }
    for (const auto& v : variants) {
      if ((found = search(v, true))) break;
    }
  }
  return found;
}

bool Planner::search_exact() {
  bool found = search(StepVariant{}, false);
  if (!found && s_.can_offload) {
    // The state on the host: the same training, slower steps beside a GPU
    // (three transfers of the parameters, a step on the CPU).
    StepVariant v;
    v.host_state = true;
    found = search(v, false);
  }
  return found || search_settings(true);
}

// The settings that keep the result (exact) or change it, in the front's
// order, each searched as a lighter optimizer is: every block checkpointed
// (unless it checkpoints itself) and halving micro-batches.
bool Planner::search_settings(bool exact) {
  for (const auto& st : s_.settings) {
    if (st.exact == exact && search(variant_of(st), true)) return true;
  }
  return false;
}

// Records `v` at micro-batch c on a real device; accepts it if it fits.
bool Planner::verify(const StepVariant& v, int64_t c, std::optional<VariantRecording> real) {
  VariantRecording r = real ? std::move(*real) : record(v, c, false);
  if (!r.unavailable.empty()) return false;
  const int64_t peak = r.report.budget_peak();
  const int64_t mb = c < s_.batch ? c : 0;
  if (peak <= limit_at(c)) {
    accepted_ = Tried{v, mb, peak};
    accepted_verified_ = !r.meta;
    accepted_recording_ = std::move(r);
    return true;
  }
  if (!closest_ || peak < closest_->peak) closest_ = Tried{v, mb, peak};
  return false;
}

// Note [Levels the search skips]
// Halving the micro-batch from the whole batch records two steps a level
// (without checkpointing, and every block checkpointed), most of them over
// the budget. A level is skipped unrecorded when a lower bound of its peak
// is over the budget. The bound comes from the same variant recorded (or
// predicted from a recording: Note [Rows advise predicts]) at the whole
// batch B, zero_grad freeing or in place alike when only the other is
// there, with P(B) its peak and K the bytes live at that peak that no batch
// changes (independent_bytes: the weights, and the gradients and optimizer
// state made in an earlier iteration; only the weights when gradients kept
// at B bound a step that frees them):
//   P(c) >= K + (P(B) - K) * c / B.
// At the same instant of the step at c, K is still live, and every other
// allocation live there is affine in the batch with an intercept >= 0, so
// at least c/B of its size at B. (The floor outside forward and backward
// would not do: the optimizer's temporaries can put it above that instant.)
// A step that is not affine may fit where the bound says it does not: the
// plan then takes a smaller micro-batch than it could, never one over the
// budget, since every plan is recorded before it is accepted.
std::optional<int64_t> Planner::lower_bound_at(const StepVariant& v, int64_t c) const {
  const Whole* best = nullptr;  // the same variant; else the same but for zero_grad
  for (const auto& w : wholes_) {
    StepVariant a = w.variant;
    a.zero_grad_in_place = v.zero_grad_in_place;
    if (!(a == v)) continue;
    if (!best || w.variant == v) best = &w;
  }
  if (!best) return std::nullopt;
  // Gradients kept at B are not live in a step that frees them: then only
  // the weights are sure to be there.
  const int64_t k = best->variant.zero_grad_in_place && !v.zero_grad_in_place ? best->weights
                                                                              : best->independent;
  return k + static_cast<int64_t>(static_cast<double>(best->peak - k) * static_cast<double>(c) /
                                  static_cast<double>(s_.batch));
}

// Whether `v` at micro-batch c is bounded over the budget (lower_bound_at);
// says so as it skips it.
bool Planner::bounded_over(const StepVariant& v, int64_t c) const {
  const std::optional<int64_t> bound = lower_bound_at(v, c);
  if (!bound || *bound <= limit_at(c)) return false;
  s_.progress.step("skip " + describe(v, s_.optimizer, s_.offload_label) + " at batch " +
                   std::to_string(c) + ": at least " + format_bytes(*bound));
  return true;
}

bool Planner::try_level(const StepVariant& base, int64_t c, bool every_only) {
  const bool users_whole = c == s_.batch && base == StepVariant{};
  // The step without checkpointing at c, recorded cheaply: a candidate
  // itself, and the chain's baseline.
  std::optional<VariantRecording> plain_c;
  if (users_whole) {
    plain_c = *plain_cheap_;
    if (!every_only && verify(base, c, plain_)) return true;
  } else if (bounded_over(base, c)) {
    // Not recorded; the chain's baseline is recorded below if needed.
  } else if (!every_only || chain_of(base) == 0) {
    plain_c = record(base, c, true);
    if (!plain_c->unavailable.empty()) return false;
    const int64_t peak = plain_c->report.budget_peak();
    if (peak <= limit_at(c) && verify(base, c, plain_c->meta ? std::nullopt : plain_c))
      return true;
    // Over the budget: still the closest the plan came, if it is.
    if (peak > limit_at(c) && (!closest_ || peak < closest_->peak))
      closest_ = Tried{base, c < s_.batch ? c : 0, peak};
  }
  if (chain_of(base) == 0) return false;
  StepVariant every = base;
  every.checkpoint.assign(n_, true);
  if (!users_whole && bounded_over(every, c)) return false;
  const VariantRecording every_c =
      users_whole && every_cheap_ ? *every_cheap_ : record(every, c, true);
  if (!every_c.unavailable.empty()) return false;
  if (every_c.report.budget_peak() > limit_at(c)) {
    if (!closest_ || every_c.report.budget_peak() < closest_->peak)
      closest_ = Tried{every, c < s_.batch ? c : 0, every_c.report.budget_peak()};
    return false;
  }
  if (every_only) return verify(every, c, every_c.meta ? std::nullopt : std::optional(every_c));
  if (!plain_c || plain_c->meta != every_c.meta) plain_c = record(base, c, every_c.meta);
  const VariantRecording& base_c = *plain_c;
  // The chain at this micro-batch, and the least recompute that fits.
  std::vector<ChainSegment> segs;
  ChainMemory mem;
  calibrate_chain(base_c.report, base_c.timeline, every_c.report, every_c.timeline, s_.chain,
                  forward_ns_, segs, mem);
  chains_.push_back({c, {segs, mem}});
  std::vector<Choice> fitting = fitting_choices(segs, mem, base, c, every_c, nullptr);
  // Verified cheapest first; every block checkpointed is the last resort.
  std::stable_sort(fitting.begin(), fitting.end(), [](const Choice& x, const Choice& y) {
    return x.recompute_ns < y.recompute_ns;
  });
  for (auto& f : fitting) {
    const bool meta = f.recording.meta;
    if (verify(f.variant, c, meta ? std::nullopt : std::optional(std::move(f.recording))))
      return true;
  }
  return false;
}

bool Planner::search(StepVariant base, bool every_only) {
  for (const auto& [key, floor] : floors_) {
    if (key == floor_key(base) && floor > limit_) {
      // Outside forward and backward the step needs more than the budget at
      // any micro-batch: nothing to record.
      s_.progress.step("skip " + describe(base, s_.optimizer, s_.offload_label) + ": " +
                       format_bytes(floor) + " outside forward and backward");
      return false;
    }
  }
  for (int64_t c = from_half_ ? (s_.batch + 1) / 2 : s_.batch;; c = (c + 1) / 2) {
    StepVariant level = base;
    // Between micro-batches the gradients accumulate: zeroed in place.
    level.zero_grad_in_place = base.zero_grad_in_place || c < s_.batch;
    if (try_level(level, c, every_only)) return true;
    if (c == 1 || whole_only_) return false;
  }
}

}  // namespace memfit::impl
