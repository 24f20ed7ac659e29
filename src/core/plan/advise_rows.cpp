// The rows of Note [How advise plans]: the plain step, each strategy at the
// whole batch, the checkpointing rules and the combinations.
#include <algorithm>
#include <optional>
#include <stdexcept>

#include "advise_planner.h"
#include "memfit/core/model/optimizers.h"
#include "memfit/core/model/step_transform.h"
#include "memfit/core/model/units.h"
#include "memfit/core/plan/chain_calibration.h"

namespace memfit::impl {

StepTimes step_times(const Timeline& t) {
  StepTimes out;
  const auto& spans = t.phase_spans();
  const auto& ev = t.events();
  if (spans.empty() || ev.empty()) return out;
  int last = 0;
  for (const auto& s : spans) last = std::max(last, s.iteration);
  for (size_t i = 0; i < spans.size(); ++i) {
    const auto& s = spans[i];
    if (s.iteration != last || s.first_event >= ev.size()) continue;
    const size_t next = i + 1 < spans.size() ? spans[i + 1].first_event : ev.size() - 1;
    const double ns = static_cast<double>(ev[std::min(next, ev.size() - 1)].time_ns -
                                          ev[s.first_event].time_ns);
    const std::string& name = t.phase_name(s.phase);
    if (name == kPhaseInputs || name == kPhaseParameters) continue;
    out.total += ns;
    if (name == kPhaseForward || name == kPhaseLoss) out.forward += ns;
    if (name == kPhaseOptimizerStep || name == kPhaseZeroGrad) out.optimizer += ns;
  }
  return out;
}

// What no micro-batch or checkpointing lowers: the peak of the phases outside
// forward, loss and backward (the weights, their gradients, the optimizer's
// state and step). The inputs phase is left out: it holds the batch.
int64_t batch_free_floor(const Report& r) {
  int64_t floor = 0;
  for (const auto& ph : r.phases) {
    if (ph.name == kPhaseParameters || ph.name == kPhaseOptimizerStep ||
        ph.name == kPhaseZeroGrad) {
      floor = std::max(floor, ph.peak_bytes);
    }
  }
  return floor;
}

// The weights on the device: the parameters phase's peak (it only
// materializes them). Forward and backward hold at least as much.
int64_t weights_peak(const Report& r) {
  int64_t w = 0;
  for (const auto& ph : r.phases) {
    if (ph.name == kPhaseParameters) w = std::max(w, ph.peak_bytes);
  }
  return w;
}

int64_t independent_bytes(const VariantRecording& r) {
  return std::max(weights_peak(r.report), batch_independent_at_peak(r.timeline));
}

// The step under the front's setting `st`, nothing else.
StepVariant variant_of(const AdviseSetting& st) {
  StepVariant v;
  v.setting = st.label;
  v.setting_exact = st.exact;
  return v;
}

void Planner::record_plain() {
  // The plain step: cheap first, since a front that cannot record on meta
  // returns a real recording there, which is all the plain step needs.
  VariantRecording first = record(StepVariant{}, s_.batch, true);
  if (!first.unavailable.empty()) {
    throw std::invalid_argument("[advise] the plain step cannot be recorded: " + first.unavailable);
  }
  if (first.meta) {
    plain_cheap_ = std::move(first);
    plain_ = record(StepVariant{}, s_.batch, false);
  } else {
    plain_ = std::move(first);
    plain_cheap_ = plain_;
  }
  a_.plain_peak = plain_.report.budget_peak();
  a_.cuda_reserved = plain_.report.cuda.has_value();
  if (a_.cuda_reserved && has_budget_ && plain_.report.peak_bytes <= limit_ &&
      a_.plain_peak > limit_) {
    // Only the allocator's cached segments are over: a setting of the card.
    a_.notes.push_back(
        "the plain step fits in allocated bytes (" + format_bytes(plain_.report.peak_bytes) +
        ") but the caching allocator reserves " + format_bytes(a_.plain_peak) +
        " for it: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True grows segments instead "
        "of caching rounded ones, and reserves closer to the allocated bytes (memfit does "
        "not model it)");
  }
  floors_.push_back({floor_key(StepVariant{}), batch_free_floor(plain_.report)});
  add_whole(StepVariant{}, plain_);
  // A meta recording's clock times the dispatch, not the work: no time is
  // estimated from it (the rows say "-").
  if (!plain_.meta) plain_times_ = step_times(plain_.timeline);
  a_.plain_step_ms = plain_times_.total / 1e6;
  forward_ns_ = block_forward_ns(plain_.timeline, s_.chain);

  {
    AdviseRow row;
    row.name = "plain (zero_grad set_to_none)";
    row.kind = StrategyKind::kBaseline;
    row.peak_bytes = a_.plain_peak;
    row.time_ratio = 1.0;
    row.time_measured = true;
    row.fits = has_budget_ && a_.plain_peak <= limit_;
    a_.rows.push_back(row);
  }
}

void Planner::strategy_rows() {
  if (s_.has_optimizer) {
    StepVariant v;
    v.zero_grad_in_place = true;
    std::optional<VariantRecording> p = predict(*plain_cheap_, Prediction::kGradientsKept);
    const bool predicted = p.has_value();
    add_row("zero_grad in place", StrategyKind::kMemory, v, std::move(p), predicted);
  } else {
    a_.notes.push_back("no optimizer: zero_grad in place and lighter optimizers do not apply");
  }
  if (n_ > 0) {
    checkpoint_rows();
  } else {
    a_.notes.push_back(
        "no chain of blocks (an nn.Sequential or nn.ModuleList of two or more blocks with "
        "parameters): activation checkpointing does not apply");
  }
  if (s_.allow_approximate) {
    StepVariant v;
    v.autocast_bf16 = true;
    add_row("autocast bf16", StrategyKind::kPrecision, v);
  } else {
    // Only allow_approximate lets the plan use it, and on a CPU without bf16
    // instructions its recording cost 3x every other row together (the
    // demo gpt: 14.7 of 19.6 s).
    a_.notes.push_back("autocast bf16: recorded with allow_approximate only (it changes the "
                       "numbers; recording it is slow where bf16 is emulated)");
  }
  if (s_.can_offload) {
    StepVariant v;
    v.host_state = true;
    std::optional<VariantRecording> p = predict(*plain_cheap_, Prediction::kStateOnHost);
    const bool predicted = p.has_value();
    add_row(s_.optimizer + "'s state and step on the host (" + s_.offload_label + ")",
            StrategyKind::kOptimizer, v, std::move(p), predicted);
  }
  if (s_.has_optimizer && s_.allow_approximate) {
    for (const auto& o : s_.other_optimizers) {
      StepVariant v;
      v.optimizer = o;
      add_row("optimizer " + o + " instead of " + s_.optimizer, StrategyKind::kOptimizer, v);
    }
  } else if (s_.has_optimizer && !s_.other_optimizers.empty()) {
    // As bf16: only allow_approximate lets the plan train with another
    // optimizer, and each row is a whole recording (about 2.3 plain steps).
    a_.notes.push_back("other optimizers: recorded with allow_approximate only (they change "
                       "the training)");
  }
  setting_rows();
  // Inference mode allocates what no_grad does (it only skips autograd's
  // bookkeeping): its row is no_grad's recording, predicted.
  std::optional<VariantRecording> no_grad;
  for (StepKind k : {StepKind::kEvalNoGrad, StepKind::kEvalInference}) {
    StepVariant v;
    v.step = k;
    const std::string name = std::string("eval step under ") + to_string(k);
    if (k == StepKind::kEvalInference && no_grad && s_.predict_rows) {
      add_row(name, StrategyKind::kEval, v, std::move(no_grad), true);
      continue;
    }
    VariantRecording r = record(v, s_.batch, true);
    if (r.unavailable.empty()) no_grad = r;
    add_row(name, StrategyKind::kEval, v, std::move(r));
  }
  combination_rows();
  note_unrecorded();
}

double Planner::estimate_ratio(const VariantRecording& r, int64_t micro_batch) const {
  if (r.meta || plain_times_.total <= 0) return -1;
  const StepTimes t = step_times(r.timeline);
  if (micro_batch <= 0) return t.total / plain_times_.total;
  const int64_t chunks = (s_.batch + micro_batch - 1) / micro_batch;
  return (static_cast<double>(chunks) * (t.total - t.optimizer) + t.optimizer) /
         plain_times_.total;
}

// Note [Rows advise predicts]
// A row is a recording of two iterations, about 2.3 plain steps; most of
// advise's cost were rows at the whole batch. Those that follow from
// recordings advise makes anyway are predicted instead, marked "~" in the
// table and "predicted" in the JSON:
// - zero_grad in place and the optimizer's state on the host, from the
//   plain step's recording (Note [Steps predicted from a recording]); the
//   same two combined with checkpointing every block, from that row's
//   recording;
// - the eval step under inference_mode, from the one under no_grad.
// A predicted row with a timeline also bounds the search (floors_,
// wholes_) as a recorded one does. The plan never rests on a prediction:
// it is accepted only on its own recording within the budget (verify), so
// a prediction under the truth costs a recording that comes out over, and
// one over the truth at worst a smaller micro-batch than needed.
// bench/advise_predicted_rows.py records every row as well
// (AdviseSettings::predict_rows false, --record-every-row) and prints the
// error of each prediction.
std::optional<VariantRecording> Planner::predict(const VariantRecording& base, Prediction p) const {
  if (!s_.predict_rows || !base.unavailable.empty() || base.timeline.empty()) return std::nullopt;
  std::optional<Timeline> t = p == Prediction::kGradientsKept ? with_gradients_kept(base.timeline)
                                                              : with_state_on_host(base.timeline);
  if (!t || t->empty()) return std::nullopt;
  VariantRecording r;
  std::string optimizer = base.report.optimizer;
  if (p == Prediction::kStateOnHost && !optimizer_on_host(optimizer)) optimizer += "-offload";
  r.report = make_report(*t, {base.report.model, base.report.batch, optimizer, base.report.mode});
  if (base.report.cuda) r.report.cuda = estimate_cuda(*t, base.report.cuda->workspace_bytes);
  r.timeline = std::move(*t);
  r.meta = base.meta;
  return r;
}

void Planner::add_row(std::string name, StrategyKind kind, const StepVariant& v,
                      std::optional<VariantRecording> given, bool predicted) {
  const VariantRecording r = given ? std::move(*given) : record(v, s_.batch, true);
  if (!r.unavailable.empty()) {
    auto same = std::find_if(unrecorded_.begin(), unrecorded_.end(),
                             [&](const auto& u) { return u.first == r.unavailable; });
    if (same == unrecorded_.end()) same = unrecorded_.insert(unrecorded_.end(), {r.unavailable, {}});
    same->second.push_back(std::move(name));
    return;
  }
  AdviseRow row;
  row.name = std::move(name);
  row.kind = kind;
  row.variant = v;
  row.peak_bytes = r.report.budget_peak();
  row.meta = r.meta;
  row.saving_bytes = plain_like(r.meta).report.budget_peak() - row.peak_bytes;
  row.fits = has_budget_ && row.peak_bytes <= limit_;
  row.predicted = predicted;
  // A prediction without a timeline has no phases.
  const bool phases = !predicted || !r.timeline.empty();
  if (phases && v.step == StepKind::kTrain && !v.autocast_bf16 && v.checkpointed() == 0)
    floors_.push_back({floor_key(v), batch_free_floor(r.report)});
  if (phases && v.step == StepKind::kTrain)
    add_whole(v, r);
  const double step = plain_times_.total;
  if (v.checkpointed() > 0) {
    row.recompute_ns = chain_recompute_ns(a_.segments, v.checkpoint);
    row.predicted_peak_bytes = chain_peak(a_.segments, a_.chain_memory, v.checkpoint);
    row.time_ratio = step > 0 ? 1.0 + row.recompute_ns / step : -1;
  } else if (v.step != StepKind::kTrain && step > 0) {
    row.time_ratio = plain_times_.forward / step;
  } else if (kind == StrategyKind::kMemory) {
    row.time_ratio = 1.0;  // zeroing in place instead of freeing: no more work
  } else if (predicted) {
    row.time_ratio = -1;  // the recording's times are the plain step's
  } else {
    row.time_ratio = estimate_ratio(r, 0);
  }
  if (row.time_ratio < 0 && v.step == StepKind::kTrain) row.time_ratio = counted_ratio(v, 0);
  a_.rows.push_back(std::move(row));
}

void Planner::checkpoint_rows() {
  StepVariant every;
  every.checkpoint.assign(n_, true);
  every_cheap_ = record(every, s_.batch, true);
  if (!every_cheap_->unavailable.empty()) {
    a_.notes.push_back("checkpointing: not recorded (" + every_cheap_->unavailable + ")");
    every_cheap_.reset();
    return;
  }
  const VariantRecording& base = plain_like(every_cheap_->meta);
  calibrate_chain(base.report, base.timeline, every_cheap_->report, every_cheap_->timeline,
                  s_.chain, forward_ns_, a_.segments, a_.chain_memory);
  a_.chain_batch = s_.batch;
  add_row("checkpoint every block (" + std::to_string(n_) + " of " + std::to_string(n_) + ")",
          StrategyKind::kCheckpointing, every, *every_cheap_);
  // Every block with gradients kept: no row, a bound for the search's
  // micro-batches, which keep them (Note [Levels the search skips]).
  if (std::optional<VariantRecording> kept = predict(*every_cheap_, Prediction::kGradientsKept)) {
    StepVariant v = every;
    v.zero_grad_in_place = true;
    add_whole(v, *kept);
  }
  const int64_t every_peak = every_cheap_->report.budget_peak();
  const ChainPlan sq = chain_plan_sqrt(a_.segments, a_.chain_memory, limit_);
  if (sq.count() > 0 && sq.count() < static_cast<int>(n_)) {
    StepVariant v;
    v.checkpoint = sq.checkpointed;
    // Recorded: the chain model's peak is a prediction with an error of its
    // own (7% under the recorded one on test_advise's uneven blocks).
    add_row("checkpoint sqrt(n): blocks " + sq.indices(), StrategyKind::kCheckpointing, v);
  }
  a_.chain_plans = compare_chain_plans(a_.segments, a_.chain_memory, limit_);
  if (!has_budget_) {
    a_.notes.push_back("no budget: give one for the planned checkpointing and a plan");
    return;
  }
  std::optional<std::pair<StepVariant, int64_t>> first;
  std::vector<Choice> fitting =
      fitting_choices(a_.segments, a_.chain_memory, StepVariant{}, s_.batch, *every_cheap_, &first);
  // The least recompute that fits; every block when nothing does.
  const auto cheapest = std::min_element(
      fitting.begin(), fitting.end(),
      [](const Choice& x, const Choice& y) { return x.recompute_ns < y.recompute_ns; });
  const StepVariant best = cheapest == fitting.end() ? every : cheapest->variant;
  if (first && !(first->first == best)) {
    a_.notes.push_back("the planner's first choice, blocks " +
                       checkpoint_indices(first->first.checkpoint) +
                       " (predicted " + format_bytes(first->second) +
                       "), measured above the budget or costlier; the planned row is the "
                       "cheapest choice that measured within it");
  }
  if (cheapest != fitting.end()) {
    const bool same = best == every;
    add_row("checkpoint planned: blocks " + checkpoint_indices(best.checkpoint) +
                (same ? " (the same as every block)" : ""),
            StrategyKind::kCheckpointing, best, std::move(cheapest->recording));
  } else {
    // The plan below may still checkpoint, beside other strategies: say
    // this is checkpointing alone at the whole batch.
    a_.notes.push_back("no checkpointing choice alone fits " + format_bytes(limit_) +
                       " at batch " + std::to_string(s_.batch) +
                       ": every block checkpointed peaks at " + format_bytes(every_peak));
  }
}

// See Note [Calibrating the chain from two profiles]: the planner's choices
// at micro-batch c, each recorded cheaply, the budget they are made for
// moved by what each missed or spared (four rounds at most). Returns the
// choices recorded within the budget, every block first when it fits;
// `first` gets the planner's first choice and its predicted peak.
std::vector<Planner::Choice> Planner::fitting_choices(
    const std::vector<ChainSegment>& segs, const ChainMemory& mem, const StepVariant& base,
    int64_t c, const VariantRecording& every,
    std::optional<std::pair<StepVariant, int64_t>>* first) {
  StepVariant every_v = base;
  every_v.checkpoint.assign(n_, true);
  std::vector<Choice> fitting;
  const int64_t limit = limit_at(c);
  if (every.report.budget_peak() <= limit)
    fitting.push_back({chain_recompute_ns(segs, every_v.checkpoint), every_v, every});
  std::vector<std::vector<bool>> tried = {every_v.checkpoint};
  int64_t aim = limit;
  for (int round = 0; round < 4; ++round) {
    const ChainPlan cp = chain_plan_optimal(segs, mem, aim);
    if (!cp.fits) break;
    StepVariant v = base;
    v.checkpoint = cp.checkpointed;
    if (first && !*first) *first = std::make_pair(v, cp.predicted_peak);
    if (std::find(tried.begin(), tried.end(), cp.checkpointed) != tried.end()) break;
    tried.push_back(cp.checkpointed);
    VariantRecording r = record(v, c, true);
    if (!r.unavailable.empty()) break;
    const int64_t peak = r.report.budget_peak();
    if (peak <= limit) fitting.push_back({cp.recompute_ns, v, std::move(r)});
    aim += limit - peak;
  }
  return fitting;
}

// When no single strategy the plan may use fits: every block checkpointed
// with each of the others, so the table shows how low the step goes.
void Planner::combination_rows() {
  bool usable_fits = false;
  bool in_place_saves = false;
  for (const auto& r : a_.rows) {
    if (r.kind != StrategyKind::kEval && (r.variant.exact() || s_.allow_approximate) && r.fits)
      usable_fits = true;
    if (r.kind == StrategyKind::kMemory && r.saving_bytes > 0) in_place_saves = true;
  }
  if (!has_budget_ || usable_fits) return;
  std::vector<StepVariant> combos;
  StepVariant every;
  every.checkpoint.assign(n_, n_ > 0);
  if (n_ > 0 && in_place_saves) {
    StepVariant v = every;
    v.zero_grad_in_place = true;
    combos.push_back(v);
  }
  if (n_ > 0 && s_.can_offload) {
    StepVariant v = every;
    v.host_state = true;
    combos.push_back(v);
  }
  if (s_.allow_approximate) {
    if (n_ > 0) {
      StepVariant v = every;
      v.autocast_bf16 = true;
      combos.push_back(v);
    }
    for (const auto& o : s_.lighter) {
      StepVariant v = every;
      v.optimizer = o;
      combos.push_back(v);
      v.autocast_bf16 = true;
      combos.push_back(v);
    }
  }
  for (const auto& st : s_.settings) {
    if (n_ == 0 || st.checkpoints || !(st.exact || s_.allow_approximate)) continue;
    StepVariant v = variant_of(st);
    v.checkpoint = every.checkpoint;
    combos.push_back(v);
  }
  std::vector<StepVariant> done;
  std::string over;  // combinations not recorded: their floor alone is over
  for (const auto& v : combos) {
    if (std::find(done.begin(), done.end(), v) != done.end()) continue;
    done.push_back(v);
    // Checkpointing lowers forward and backward only: a floor over the
    // budget stays over, and the search skips it too. Not worth a recording.
    const auto floor = std::find_if(floors_.begin(), floors_.end(),
                                    [&](const auto& f) { return f.first == floor_key(v); });
    if (floor != floors_.end() && floor->second > limit_) {
      StepVariant alone = v;
      alone.checkpoint.clear();
      over += (over.empty() ? "" : ", ") + describe(alone, s_.optimizer, s_.offload_label) +
              " (" + format_bytes(floor->second) + ")";
      continue;
    }
    // Every block with gradients kept, or with the state on the host:
    // predicted from every block's recording.
    std::optional<VariantRecording> p;
    StepVariant rest = v;
    rest.zero_grad_in_place = false;
    rest.host_state = false;
    if (every_cheap_ && rest == every && v.zero_grad_in_place != v.host_state) {
      p = predict(*every_cheap_, v.host_state ? Prediction::kStateOnHost
                                              : Prediction::kGradientsKept);
    }
    const bool predicted = p.has_value();
    add_row(describe(v, s_.optimizer, s_.offload_label), StrategyKind::kCombination, v,
            std::move(p), predicted);
  }
  if (!over.empty()) {
    a_.notes.push_back("not combined with checkpointing every block: outside forward and "
                       "backward these need more than the budget whatever is checkpointed: " +
                       over);
  }
}

const AdviseSetting* Planner::setting_of(const StepVariant& v) const {
  if (v.setting.empty()) return nullptr;
  for (const auto& st : s_.settings) {
    if (st.label == v.setting) return &st;
  }
  throw std::logic_error("[advise] the variant's setting '" + v.setting + "' is not the front's");
}

void Planner::note_unrecorded() {
  for (const auto& [why, names] : unrecorded_) {
    if (names.size() == 1) {
      a_.notes.push_back(names[0] + ": not recorded (" + why + ")");
      continue;
    }
    std::string list;  // names hold "; " themselves: quoted
    for (const auto& n : names) list += (list.empty() ? "\"" : ", \"") + n + "\"";
    a_.notes.push_back("not recorded (" + why + "): " + list);
  }
}

// Each of the front's settings at the whole batch, listed whether or not
// the plan may use it.
void Planner::setting_rows() {
  for (const auto& st : s_.settings) add_row(st.label, StrategyKind::kSetting, variant_of(st));
}


}  // namespace memfit::impl
