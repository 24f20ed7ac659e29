#include "memfit/core/advise_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <stdexcept>

#include "memfit/core/chain_calibration.h"
#include "memfit/core/oom_cause.h"
#include "memfit/core/units.h"

namespace memfit {

// Note [How advise plans]
// The plain step is recorded once on a real device: its peak is the
// baseline and its recorded times price every strategy (a block's forward
// is what checkpointing it recomputes; forward and loss are an eval step).
// Each strategy's row is then recorded "cheaply": the front may record it on
// the meta device, where nothing is computed, and says so. The rows compare
// against the plain step recorded the same way, so a saving never mixes the
// two devices.
// The plan halves the micro-batch from the whole batch (a level whose peak
// is bounded over the budget is skipped unrecorded: Note [Levels the search
// skips]), and stops at the largest micro-batch where something fits: the
// plain step, else the
// checkpointing with the least recompute the chain model and the recordings
// agree on (See Note [Calibrating the chain from two profiles]). A larger
// micro-batch is preferred to a cheaper-looking smaller one: fewer, fuller
// kernels on a GPU, and BatchNorm sees more of the batch. Only when nothing
// on the device alone fits, the optimizer's state goes to the host; only
// with allow_approximate, bf16 and lighter optimizers. Every plan returned
// was recorded on a real device at its micro-batch and measured within the
// budget: a cheap recording only says where to look. Times are estimated
// from the recorded times (labelled so) unless the front times the plan.
//
// A front may also name settings (AdviseSetting): changes to the model or
// its optimizer that only it can make (bf16 weights, Adafactor, LoRA,
// HF gradient checkpointing), which it applies to a copy of the model when
// a variant names one. Each is a row at the whole batch, always listed. The
// search tries them after the state on the host: first those that keep the
// result, then, with allow_approximate, the others, in the front's order,
// before bf16 autocast and the lighter optimizers. A setting is searched as
// a lighter optimizer is: every block checkpointed (none when the setting
// checkpoints the model itself) at halving micro-batches, and skipped when
// its row's peak outside forward and backward is over the budget. Which
// optimizers are rows and which are lighter is one rule for both fronts,
// optimizer_choices().

const char* to_string(StrategyKind kind) {
  switch (kind) {
    case StrategyKind::kBaseline: return "baseline";
    case StrategyKind::kMemory: return "memory";
    case StrategyKind::kCheckpointing: return "checkpointing";
    case StrategyKind::kPrecision: return "precision";
    case StrategyKind::kOptimizer: return "optimizer";
    case StrategyKind::kEval: return "eval";
    case StrategyKind::kCombination: return "combination";
    case StrategyKind::kSetting: return "setting";
  }
  return "?";
}

const char* to_string(StepKind kind) {
  switch (kind) {
    case StepKind::kTrain: return "train";
    case StepKind::kEvalNoGrad: return "no_grad";
    case StepKind::kEvalInference: return "inference_mode";
  }
  return "?";
}

int StepVariant::checkpointed() const {
  return static_cast<int>(std::count(checkpoint.begin(), checkpoint.end(), true));
}

bool StepVariant::operator==(const StepVariant& o) const {
  auto flags = [](const std::vector<bool>& f) {
    std::vector<bool> out = f;
    while (!out.empty() && !out.back()) out.pop_back();  // [] == [false, false]
    return out;
  };
  return flags(checkpoint) == flags(o.checkpoint) && autocast_bf16 == o.autocast_bf16 &&
         zero_grad_in_place == o.zero_grad_in_place && optimizer == o.optimizer &&
         host_state == o.host_state && step == o.step && setting == o.setting;
}

OptimizerChoices optimizer_choices(const std::string& user_kind) {
  OptimizerChoices c;
  if (user_kind == "none") return c;
  const std::string suffix = "-offload";
  const bool offloaded = user_kind.size() > suffix.size() &&
                         user_kind.compare(user_kind.size() - suffix.size(), suffix.size(),
                                           suffix) == 0;
  const std::string kind = offloaded ? user_kind.substr(0, user_kind.size() - suffix.size())
                                     : user_kind;
  for (const std::string o : {"adam", "momentum", "sgd"}) {
    // Another Adam (AdamW, NAdam) keeps the same two states: an adam row
    // would cost a recording to show no saving.
    if (kind != o && !(o == "adam" && optimizer_is_adam(kind))) c.others.push_back(o);
  }
  // Lighter: less state per parameter. Another optimizer's class (AdamW,
  // Adafactor) is taken to keep Adam's two states.
  if (kind == "momentum") {
    c.lighter = {"sgd"};
  } else if (kind != "sgd") {
    c.lighter = {"momentum", "sgd"};
  }
  c.can_offload = kind != "sgd" && !offloaded;
  return c;
}

std::string describe(const StepVariant& v, const std::string& user_optimizer,
                     const std::string& offload_label, int64_t micro_batch) {
  std::vector<std::string> parts;
  if (v.step != StepKind::kTrain) parts.push_back(std::string("eval step under ") + to_string(v.step));
  if (!v.setting.empty()) parts.push_back(v.setting);
  const int k = v.checkpointed();
  const int n = static_cast<int>(v.checkpoint.size());
  if (k > 0 && k == n) {
    parts.push_back("checkpoint every block (" + std::to_string(n) + " of " + std::to_string(n) + ")");
  } else if (k > 0) {
    parts.push_back("checkpoint blocks " + checkpoint_indices(v.checkpoint) + " (" +
                    std::to_string(k) + " of " + std::to_string(n) + ")");
  }
  if (v.autocast_bf16) parts.push_back("autocast bf16");
  if (!v.optimizer.empty()) parts.push_back("optimizer " + v.optimizer + " instead of " + user_optimizer);
  if (v.host_state) {
    parts.push_back(user_optimizer + "'s state and step on the host (" + offload_label + ")");
  }
  // Micro-batches accumulate in place whatever the variant says.
  if (v.zero_grad_in_place && micro_batch == 0) parts.push_back("zero_grad in place");
  if (micro_batch > 0) parts.push_back("micro-batches of " + std::to_string(micro_batch));
  if (parts.empty()) return "the plain step";
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

namespace {

// Recorded times of the last iteration, in ns.
struct StepTimes {
  double forward = 0;  // forward and loss
  double optimizer = 0;  // optimizer step and zero_grad
  double total = 0;
};

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

// The step under the front's setting `st`, nothing else.
StepVariant variant_of(const AdviseSetting& st) {
  StepVariant v;
  v.setting = st.label;
  v.setting_exact = st.exact;
  return v;
}

struct Tried {
  StepVariant variant;
  int64_t micro_batch = 0;
  int64_t peak = 0;
};

class Planner {
 public:
  Planner(const AdviseMeasurer& m, const AdviseSettings& s) : m_(m), s_(s) {
    has_budget_ = s.budget >= 0;
    limit_ = has_budget_ ? s.budget - s.reserve_bytes : std::numeric_limits<int64_t>::max() / 4;
    n_ = s.chain.size();
  }

  Advice run();

 private:
  RecordedStep record(const StepVariant& v, int64_t batch, bool cheap) {
    s_.progress.step((cheap ? "record " : "record on the device ") +
                     describe(v, s_.optimizer, s_.offload_label) + " at batch " +
                     std::to_string(batch));
    RecordedStep r = m_.record(v, batch, cheap);
    if (!r.meta) ++a_.recordings;
    return r;
  }
  const RecordedStep& plain_like(bool meta) const { return meta ? *plain_cheap_ : plain_; }
  double estimate_ratio(const RecordedStep& r, int64_t micro_batch) const;
  // The front's estimate (FLOPs) where the plain step has no recorded times;
  // -1 otherwise.
  double counted_ratio(const StepVariant& v, int64_t micro_batch) {
    if (!m_.estimate_ratio || plain_times_.total > 0) return -1;
    a_.estimated_from = m_.estimated_from;
    return m_.estimate_ratio(v, micro_batch);
  }
  void add_row(std::string name, StrategyKind kind, const StepVariant& v,
               std::optional<RecordedStep> given = std::nullopt);
  void checkpoint_rows();
  void combination_rows();
  struct Choice {
    double recompute_ns = 0;
    StepVariant variant;
    RecordedStep recording;  // cheap: on meta when the front could
  };
  std::vector<Choice> fitting_choices(const std::vector<ChainSegment>& segs,
                                      const ChainMemory& mem, const StepVariant& base, int64_t c,
                                      const RecordedStep& every,
                                      std::optional<std::pair<StepVariant, int64_t>>* first);
  bool search(StepVariant base, bool approximate_only_every);
  bool try_level(const StepVariant& base, int64_t c, bool every_only);
  bool verify(const StepVariant& v, int64_t c, std::optional<RecordedStep> real = std::nullopt);
  void finish_plan();
  const AdviseSetting* setting_of(const StepVariant& v) const;
  std::string does_not_fit_message(int64_t outside) const;
  // The blocks the planner may checkpoint under `v`: none when its setting
  // checkpoints the model itself.
  size_t chain_of(const StepVariant& v) const {
    const AdviseSetting* st = setting_of(v);
    return st && st->checkpoints ? 0 : n_;
  }
  void setting_rows();
  void note_unrecorded();
  bool search_settings(bool exact);

  const AdviseMeasurer& m_;
  const AdviseSettings& s_;
  bool has_budget_ = false;
  int64_t limit_ = 0;
  size_t n_ = 0;
  Advice a_;
  RecordedStep plain_;
  std::optional<RecordedStep> plain_cheap_;
  StepTimes plain_times_;
  std::vector<double> forward_ns_;
  std::optional<RecordedStep> every_cheap_;
  std::optional<Tried> accepted_;
  std::optional<Tried> closest_;
  std::optional<RecordedStep> accepted_recording_;
  bool accepted_verified_ = false;
  // batch_free_floor of each optimizer and setting (the front's setting,
  // optimizer, state on the host) recorded at the whole batch: a search it
  // rules out is skipped.
  using FloorKey = std::tuple<std::string, std::string, bool>;
  static FloorKey floor_key(const StepVariant& v) { return {v.setting, v.optimizer, v.host_state}; }
  std::vector<std::pair<FloorKey, int64_t>> floors_;
  // Each training variant recorded at the whole batch: its peak and its
  // weights' (weights_peak), for lower_bound_at.
  struct Whole {
    StepVariant variant;
    int64_t peak = 0;
    int64_t weights = 0;
  };
  std::vector<Whole> wholes_;
  // See Note [Levels the search skips].
  std::optional<int64_t> lower_bound_at(const StepVariant& v, int64_t c) const;
  bool bounded_over(const StepVariant& v, int64_t c) const;
  // The rows the front could not record, by its reason: one note a reason.
  std::vector<std::pair<std::string, std::vector<std::string>>> unrecorded_;
  // The chain calibrated at each micro-batch the search reached.
  std::vector<std::pair<int64_t, std::pair<std::vector<ChainSegment>, ChainMemory>>> chains_;
};

double Planner::estimate_ratio(const RecordedStep& r, int64_t micro_batch) const {
  if (r.meta || plain_times_.total <= 0) return -1;
  const StepTimes t = step_times(r.timeline);
  if (micro_batch <= 0) return t.total / plain_times_.total;
  const int64_t chunks = (s_.batch + micro_batch - 1) / micro_batch;
  return (static_cast<double>(chunks) * (t.total - t.optimizer) + t.optimizer) /
         plain_times_.total;
}

void Planner::add_row(std::string name, StrategyKind kind, const StepVariant& v,
                      std::optional<RecordedStep> given) {
  const RecordedStep r = given ? std::move(*given) : record(v, s_.batch, true);
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
  if (v.step == StepKind::kTrain && !v.autocast_bf16 && v.checkpointed() == 0)
    floors_.push_back({floor_key(v), batch_free_floor(r.report)});
  if (v.step == StepKind::kTrain)
    wholes_.push_back({v, r.report.budget_peak(), weights_peak(r.report)});
  const double step = plain_times_.total;
  if (v.checkpointed() > 0) {
    row.recompute_ns = chain_recompute_ns(a_.segments, v.checkpoint);
    row.predicted_peak_bytes = chain_peak(a_.segments, a_.chain_memory, v.checkpoint);
    row.time_ratio = step > 0 ? 1.0 + row.recompute_ns / step : -1;
  } else if (v.step != StepKind::kTrain && step > 0) {
    row.time_ratio = plain_times_.forward / step;
  } else if (kind == StrategyKind::kMemory) {
    row.time_ratio = 1.0;  // zeroing in place instead of freeing: no more work
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
  const RecordedStep& base = plain_like(every_cheap_->meta);
  calibrate_chain(base.report, base.timeline, every_cheap_->report, every_cheap_->timeline,
                  s_.chain, forward_ns_, a_.segments, a_.chain_memory);
  a_.chain_batch = s_.batch;
  add_row("checkpoint every block (" + std::to_string(n_) + " of " + std::to_string(n_) + ")",
          StrategyKind::kCheckpointing, every, *every_cheap_);
  const int64_t every_peak = every_cheap_->report.budget_peak();
  const ChainPlan sq = chain_plan_sqrt(a_.segments, a_.chain_memory, limit_);
  if (sq.count() > 0 && sq.count() < static_cast<int>(n_)) {
    StepVariant v;
    v.checkpoint = sq.checkpointed;
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
    a_.notes.push_back("no checkpointing choice fits " + format_bytes(limit_) +
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
    int64_t c, const RecordedStep& every, std::optional<std::pair<StepVariant, int64_t>>* first) {
  StepVariant every_v = base;
  every_v.checkpoint.assign(n_, true);
  std::vector<Choice> fitting;
  if (every.report.budget_peak() <= limit_)
    fitting.push_back({chain_recompute_ns(segs, every_v.checkpoint), every_v, every});
  std::vector<std::vector<bool>> tried = {every_v.checkpoint};
  int64_t aim = limit_;
  for (int round = 0; round < 4; ++round) {
    const ChainPlan cp = chain_plan_optimal(segs, mem, aim);
    if (!cp.fits) break;
    StepVariant v = base;
    v.checkpoint = cp.checkpointed;
    if (first && !*first) *first = std::make_pair(v, cp.predicted_peak);
    if (std::find(tried.begin(), tried.end(), cp.checkpointed) != tried.end()) break;
    tried.push_back(cp.checkpointed);
    RecordedStep r = record(v, c, true);
    if (!r.unavailable.empty()) break;
    const int64_t peak = r.report.budget_peak();
    if (peak <= limit_) fitting.push_back({cp.recompute_ns, v, std::move(r)});
    aim += limit_ - peak;
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
    add_row(describe(v, s_.optimizer, s_.offload_label), StrategyKind::kCombination, v);
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
bool Planner::verify(const StepVariant& v, int64_t c, std::optional<RecordedStep> real) {
  RecordedStep r = real ? std::move(*real) : record(v, c, false);
  if (!r.unavailable.empty()) return false;
  const int64_t peak = r.report.budget_peak();
  const int64_t mb = c < s_.batch ? c : 0;
  if (peak <= limit_) {
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
// is over the budget. The bound comes from the same variant recorded at the
// whole batch B (as a row; zero_grad freeing or in place alike), with W its
// weights (the parameters phase's peak) and P(B) its peak:
//   P(c) >= W + (P(B) - W) * c / B.
// Say forward and backward peak at I + s*c (I >= W: they hold the weights)
// and the phases outside them at F, so P(c) = max(F, I + s*c). If P(B) is
// I + s*B, the bound is W*(1 - c/B) + (I + s*B)*c/B <= I + s*c; if it is F,
// the bound is between W and F. (The floor outside forward and backward
// would not do: the optimizer's temporaries can put F above I.) A step
// that is not affine may fit where the bound says it does not: the plan
// then takes a smaller micro-batch than it could, never one over the
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
  return best->weights + static_cast<int64_t>(static_cast<double>(best->peak - best->weights) *
                                            static_cast<double>(c) /
                                            static_cast<double>(s_.batch));
}

// Whether `v` at micro-batch c is bounded over the budget (lower_bound_at);
// says so as it skips it.
bool Planner::bounded_over(const StepVariant& v, int64_t c) const {
  const std::optional<int64_t> bound = lower_bound_at(v, c);
  if (!bound || *bound <= limit_) return false;
  s_.progress.step("skip " + describe(v, s_.optimizer, s_.offload_label) + " at batch " +
                   std::to_string(c) + ": at least " + format_bytes(*bound));
  return true;
}

bool Planner::try_level(const StepVariant& base, int64_t c, bool every_only) {
  const bool users_whole = c == s_.batch && base == StepVariant{};
  // The step without checkpointing at c, recorded cheaply: a candidate
  // itself, and the chain's baseline.
  std::optional<RecordedStep> plain_c;
  if (users_whole) {
    plain_c = *plain_cheap_;
    if (!every_only && verify(base, c, plain_)) return true;
  } else if (bounded_over(base, c)) {
    // Not recorded; the chain's baseline is recorded below if needed.
  } else if (!every_only || chain_of(base) == 0) {
    plain_c = record(base, c, true);
    if (!plain_c->unavailable.empty()) return false;
    const int64_t peak = plain_c->report.budget_peak();
    if (peak <= limit_ && verify(base, c, plain_c->meta ? std::nullopt : plain_c)) return true;
    // Over the budget: still the closest the plan came, if it is.
    if (peak > limit_ && (!closest_ || peak < closest_->peak))
      closest_ = Tried{base, c < s_.batch ? c : 0, peak};
  }
  if (chain_of(base) == 0) return false;
  StepVariant every = base;
  every.checkpoint.assign(n_, true);
  if (!users_whole && bounded_over(every, c)) return false;
  const RecordedStep every_c = users_whole && every_cheap_ ? *every_cheap_ : record(every, c, true);
  if (!every_c.unavailable.empty()) return false;
  if (every_c.report.budget_peak() > limit_) {
    if (!closest_ || every_c.report.budget_peak() < closest_->peak)
      closest_ = Tried{every, c < s_.batch ? c : 0, every_c.report.budget_peak()};
    return false;
  }
  if (every_only) return verify(every, c, every_c.meta ? std::nullopt : std::optional(every_c));
  if (!plain_c || plain_c->meta != every_c.meta) plain_c = record(base, c, every_c.meta);
  const RecordedStep& base_c = *plain_c;
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
  for (int64_t c = s_.batch;; c = (c + 1) / 2) {
    StepVariant level = base;
    // Between micro-batches the gradients accumulate: zeroed in place.
    level.zero_grad_in_place = base.zero_grad_in_place || c < s_.batch;
    if (try_level(level, c, every_only)) return true;
    if (c == 1) return false;
  }
}

void Planner::finish_plan() {
  AdvisePlan& p = a_.plan;
  if (!accepted_) {
    // A search ruled out before recording (its floor is over) never came
    // close: the closest is also the lowest row the plan may use.
    for (const auto& r : a_.rows) {
      if (r.kind == StrategyKind::kEval || !(r.variant.exact() || s_.allow_approximate)) continue;
      if (!closest_ || r.peak_bytes < closest_->peak) closest_ = Tried{r.variant, 0, r.peak_bytes};
    }
  }
  const std::optional<Tried>& t = accepted_ ? accepted_ : closest_;
  if (!t) return;
  p.found = accepted_.has_value();
  p.verified = p.found && accepted_verified_;
  if (p.found && !p.verified) {
    // Allocated bytes understate a card: its caching allocator reserves
    // more (the 8B example: 22.30 GiB allocated, 24.15 reserved).
    a_.notes.push_back(
        std::string("the plan is unverified: it was recorded on the meta device only (the "
                    "model's weights are there), so no real step measured it; ") +
        (a_.cuda_reserved
             ? "its peak is the CUDA caching allocator's reserved bytes, replayed on the "
               "recorded step (the CUDA context and other processes are not in it)"
             : "its peak is allocated bytes, and a CUDA card's caching allocator reserves "
               "more: advise for a CUDA target compares the reserved bytes"));
  }
  p.variant = t->variant;
  p.micro_batch = t->micro_batch;
  p.peak_bytes = t->peak;
  p.exact = t->variant.exact();
  p.optimizer = t->variant.optimizer.empty() ? s_.optimizer : t->variant.optimizer;
  if (t->variant.host_state) p.optimizer += "-offload";
  p.summary = describe(p.variant, s_.optimizer, s_.offload_label, p.micro_batch);
  if (p.found) {
    if (m_.time_ratio) {
      s_.progress.step("time the plan against the plain step");
      p.time_ratio = m_.time_ratio(p.variant, p.micro_batch);
      p.time_measured = true;
    } else if (p.micro_batch == 0 && p.variant.checkpointed() > 0 && plain_times_.total > 0 &&
               p.variant.checkpoint.size() == a_.segments.size()) {
      // As the checkpointing rows are: the plain step plus the recompute.
      p.time_ratio = 1.0 + chain_recompute_ns(a_.segments, p.variant.checkpoint) /
                               plain_times_.total;
    } else {
      p.time_ratio = estimate_ratio(*accepted_recording_, p.micro_batch);
    }
    if (p.time_ratio < 0) p.time_ratio = counted_ratio(p.variant, p.micro_batch);
    // The rules are compared on the chain the plan's checkpointing was made for.
    for (const auto& [c, chain] : chains_) {
      if (c == (p.micro_batch > 0 ? p.micro_batch : s_.batch) && p.variant.checkpointed() > 0) {
        a_.segments = chain.first;
        a_.chain_memory = chain.second;
        a_.chain_batch = c;
        a_.chain_plans = compare_chain_plans(a_.segments, a_.chain_memory, limit_);
      }
    }
  }
}

// The line a front raises when nothing meets the budget: the lowest peak
// the user's terms reached (a row, or the plan's search with its
// micro-batches), what allowing approximate strategies reaches or adds, and
// what fills the plain step's peak whatever the batch.
std::string Planner::does_not_fit_message(int64_t outside) const {
  const AdviseRow* low = nullptr;     // the lowest row the plan may use
  const AdviseRow* lowest = nullptr;  // the lowest row of all
  std::vector<std::string> settings;  // approximate settings, by label
  for (const auto& r : a_.rows) {
    if (r.kind == StrategyKind::kEval) continue;
    if (!lowest || r.peak_bytes < lowest->peak_bytes) lowest = &r;
    if ((r.variant.exact() || s_.allow_approximate) && (!low || r.peak_bytes < low->peak_bytes))
      low = &r;
    if (r.kind == StrategyKind::kSetting && !r.variant.exact()) settings.push_back(r.name);
  }
  int64_t low_peak = low ? low->peak_bytes : a_.plain_peak;
  std::string low_name = low ? low->name : "the plain step";
  if (a_.plan.peak_bytes > 0 && a_.plan.peak_bytes < low_peak) {
    low_peak = a_.plan.peak_bytes;
    low_name = a_.plan.summary;
  }
  std::string m = "no strategy fits the budget of " + format_bytes(s_.budget) +
                  ": the smallest peak memfit reached is " + format_bytes(low_peak) + ", with " +
                  low_name + " (plain step: " + format_bytes(a_.plain_peak) + ")";
  if (lowest && lowest->peak_bytes < low_peak) {
    m += "; " + s_.approximate_flag + " reaches " + format_bytes(lowest->peak_bytes) + " with " +
         lowest->name + ", changing the numbers";
  } else if (!s_.allow_approximate) {
    std::string listed;
    for (const auto& n : settings) listed += (listed.empty() ? "" : ", ") + n;
    m += "; " + s_.approximate_flag + " also tries bf16 autocast and lighter optimizers" +
         (listed.empty() ? "" : " and the settings (" + listed + ")") +
         " combined with these, changing the numbers";
  }
  const bool state_on_host = optimizer_on_host(s_.optimizer);
  const OomPhase phase = oom_phase_of(plain_.report.peak_phase);
  const OomDiagnosis d = diagnose_oom(phase, oom_memory_of(plain_.report.categories_at_peak),
                                      s_.budget, state_on_host);
  return m + ". Whatever the batch, the plain step peaks at " + format_bytes(outside) +
         " outside forward and backward (parameters, gradients, optimizer state). The plain "
         "step peaks in " + to_string(phase) + ", with " + d.what_fills + ": " + d.advice;
}

Advice Planner::run() {
  a_.batch = s_.batch;
  a_.budget = s_.budget;
  a_.reserve_bytes = s_.reserve_bytes;
  a_.optimizer = s_.optimizer;
  // The plain step: cheap first, since a front that cannot record on meta
  // returns a real recording there, which is all the plain step needs.
  RecordedStep first = record(StepVariant{}, s_.batch, true);
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
  wholes_.push_back({StepVariant{}, plain_.report.budget_peak(), weights_peak(plain_.report)});
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
  if (s_.has_optimizer) {
    StepVariant v;
    v.zero_grad_in_place = true;
    add_row("zero_grad in place", StrategyKind::kMemory, v);
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
    add_row(s_.optimizer + "'s state and step on the host (" + s_.offload_label + ")",
            StrategyKind::kOptimizer, v);
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
  for (StepKind k : {StepKind::kEvalNoGrad, StepKind::kEvalInference}) {
    StepVariant v;
    v.step = k;
    add_row(std::string("eval step under ") + to_string(k), StrategyKind::kEval, v);
  }
  combination_rows();
  note_unrecorded();

  if (has_budget_) {
    bool found = search(StepVariant{}, false);
    if (!found && s_.can_offload) {
      // The state on the host: the same training, slower steps beside a GPU
      // (three transfers of the parameters, a step on the CPU).
      StepVariant v;
      v.host_state = true;
      found = search(v, false);
    }
    if (!found) found = search_settings(true);
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
    finish_plan();
    if (!a_.plan.found) {
      std::string approximate_settings;
      for (const auto& st : s_.settings) {
        if (!st.exact) approximate_settings += (approximate_settings.empty() ? "" : ", ") + st.label;
      }
      int64_t outside = 0;
      for (const auto& ph : plain_.report.phases) {
        if (ph.name != kPhaseForward && ph.name != kPhaseLoss && ph.name != kPhaseBackward)
          outside = std::max(outside, ph.peak_bytes);
      }
      a_.notes.push_back(
          "nothing measured fits " + format_bytes(s_.budget) + ": the lowest peak is " +
          format_bytes(a_.plan.peak_bytes) +
          (s_.allow_approximate ? ""
           : approximate_settings.empty()
               ? "; allowing approximate strategies (bf16, a lighter optimizer) may help"
               : "; allowing approximate strategies (bf16, a lighter optimizer, " +
                     approximate_settings + ") may help") +
          "; outside forward and backward the step peaks at " + format_bytes(outside) +
          " whatever the batch");
      const OomPhase phase = oom_phase_of(plain_.report.peak_phase);
      const OomDiagnosis d =
          diagnose_oom(phase, oom_memory_of(plain_.report.categories_at_peak), s_.budget,
                       false);
      a_.notes.push_back(std::string("the plain step peaks in ") + to_string(phase) + ", with " +
                         d.what_fills + ": " + d.advice);
      a_.does_not_fit = does_not_fit_message(outside);
    }
  } else {
    a_.plan.summary = "the plain step";
    a_.plan.peak_bytes = a_.plain_peak;
    a_.plan.optimizer = s_.optimizer;
  }
  return std::move(a_);
}

}  // namespace

Advice plan_advice(const AdviseMeasurer& measurer, const AdviseSettings& settings) {
  if (settings.batch < 1) {
    throw std::invalid_argument("[advise] batch must be >= 1, got " +
                                std::to_string(settings.batch));
  }
  if (!measurer.record) {
    throw std::invalid_argument("[advise] the measurer cannot record a step");
  }
  if (!settings.cards.empty()) return plan_cards(measurer, settings);
  return Planner(measurer, settings).run();
}

}  // namespace memfit
