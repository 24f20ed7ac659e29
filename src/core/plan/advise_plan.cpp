#include "memfit/core/plan/advise_plan.h"

#include <algorithm>
#include <stdexcept>

#include "advise_planner.h"
#include "memfit/core/model/optimizers.h"
#include "memfit/core/plan/checkpoint_plan.h"

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

std::string mixing_layers_phrase(const std::vector<std::string>& paths) {
  if (paths.empty()) return "";
  std::string shown;
  const size_t listed = std::min<size_t>(paths.size(), 3);
  for (size_t i = 0; i < listed; ++i) shown += (i ? ", " : "") + paths[i];
  if (paths.size() > listed) shown += " and " + std::to_string(paths.size() - listed) + " more";
  return "the BatchNorm layers (" + shown + ")";
}

OptimizerChoices optimizer_choices(const std::string& user_kind) {
  OptimizerChoices c;
  const OptimizerSpec* user = find_optimizer(user_kind);
  if (user && user->torch_class.empty()) return c;  // no optimizer: nothing to compare
  const bool offloaded = optimizer_on_host(user_kind);
  const std::string kind =
      offloaded ? user_kind.substr(0, user_kind.size() - std::string(kOffloadSuffix).size())
                : user_kind;
  // Lighter: less state per parameter, most state first. Another
  // optimizer's class (AdamW, Adafactor) is taken to keep Adam's two states.
  const int states = optimizer_states(kind);
  std::vector<const OptimizerSpec*> lighter;
  for (const OptimizerSpec& o : builtin_optimizers()) {
    if (o.on_host || o.torch_class.empty()) continue;  // offloading is a row of its own
    // Another Adam (AdamW, NAdam) keeps the same two states: an adam row
    // would cost a recording to show no saving.
    if (kind != o.name && !(optimizer_is_adam(o.name) && optimizer_is_adam(kind))) {
      c.others.push_back(o.name);
    }
    if (o.states < states) lighter.push_back(&o);
  }
  std::stable_sort(lighter.begin(), lighter.end(),
                   [](const OptimizerSpec* a, const OptimizerSpec* b) { return a->states > b->states; });
  for (const OptimizerSpec* o : lighter) c.lighter.push_back(o->name);
  c.can_offload = states > 0 && !offloaded;
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

namespace impl {

Advice Planner::run() {
  a_.batch = s_.batch;
  a_.budget = s_.budget;
  a_.reserve_bytes = s_.reserve_bytes;
  a_.optimizer = s_.optimizer;
  record_plain();
  strategy_rows();
  if (has_budget_) {
    search_plan();
    finish_plan();
    if (!a_.plan.found) note_nothing_fits();
  } else {
    a_.plan.summary = "the plain step";
    a_.plan.peak_bytes = a_.plain_peak;
    a_.plan.optimizer = s_.optimizer;
  }
  return std::move(a_);
}

}  // namespace impl

Advice plan_advice(const AdviseMeasurer& measurer, const AdviseSettings& settings) {
  if (settings.batch < 1) {
    throw std::invalid_argument("[advise] batch must be >= 1, got " +
                                std::to_string(settings.batch));
  }
  if (!measurer.record) {
    throw std::invalid_argument("[advise] the measurer cannot record a step");
  }
  if (!settings.cards.empty()) return plan_cards(measurer, settings);
  return impl::Planner(measurer, settings).run();
}

}  // namespace memfit
