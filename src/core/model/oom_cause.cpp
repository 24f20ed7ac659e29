#include "memfit/core/model/oom_cause.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "memfit/core/model/units.h"

namespace memfit {
namespace {

constexpr const char* kModelAdvice =
    "The model alone (parameters and their gradients) exceeds the memory: a "
    "smaller batch "
    "cannot help; use a bigger card, shard the model (ZeRO/FSDP: "
    "report.data_parallel() "
    "shows each rank's share), or lower precision.";
constexpr const char* kStateAdvice =
    "A smaller batch cannot help: keep the optimizer's state on the host "
    "(memfit.offload, --optimizer adam-offload), use a lighter optimizer "
    "(momentum: 1x "
    "the parameters of state, sgd: none), or mixed precision.";
constexpr const char* kStateOnHostAdvice =
    "A smaller batch cannot help: the optimizer's state is already on the "
    "host; use a "
    "lighter optimizer (sgd: no state), mixed precision, or shard the model.";
constexpr const char* kBatchAdvice =
    "The batch's own inputs and targets are the excess: keep the batch on the "
    "host and "
    "move each micro-batch to the device as it runs (memfit.Trainer does: "
    "pin_memory and "
    "non_blocking copies on CUDA), or use a smaller batch.";
constexpr const char* kActivationsAdvice =
    "The activations saved for the backward are the excess: activation "
    "checkpointing "
    "(memfit advise measures it), mixed precision, or smaller micro-batches "
    "(memfit.Trainer splits the batch and keeps its gradients exact).";
constexpr const char* kTemporariesAdvice =
    "What the ops hold while they run is the excess: smaller micro-batches "
    "(memfit.Trainer), mixed precision, or fused/in-place ops (memfit advise).";
constexpr const char* kOtherAdvice =
    "Most of it is not the step: free what the loop holds (tensors kept across "
    "steps, "
    "losses kept with their graphs, a batch left on the device), or give it "
    "more memory.";

}  // namespace

OomPhase oom_phase_of(std::string_view phase) {
  if (phase == "parameters") return OomPhase::kParameters;
  if (phase == "inputs") return OomPhase::kInputs;
  if (phase == "forward" || phase == "loss") return OomPhase::kForward;
  if (phase == "backward") return OomPhase::kBackward;
  if (phase == "optimizer_step") return OomPhase::kOptimizerStep;
  return OomPhase::kUnknown;
}

OomMemory oom_memory_of(const std::array<int64_t, kNumCategories>& c) {
  auto at = [&](Category k) { return c[static_cast<size_t>(k)]; };
  OomMemory m;
  m.parameters = at(Category::kParameter) + at(Category::kBuffer);
  m.gradients = at(Category::kGradient);
  m.optimizer_state = at(Category::kOptimizerState);
  m.batch = at(Category::kInput);
  m.activations = at(Category::kActivation);
  m.temporaries = at(Category::kTemporary);
  m.other = at(Category::kOther) + at(Category::kWorkspace);
  return m;
}

const char* to_string(OomPhase phase) {
  switch (phase) {
    case OomPhase::kParameters:
      return "putting the model on the device";
    case OomPhase::kInputs:
      return "moving the batch to the device";
    case OomPhase::kForward:
      return "the forward";
    case OomPhase::kBackward:
      return "the backward";
    case OomPhase::kOptimizerStep:
      return "the optimizer step";
    case OomPhase::kUnknown:
      break;
  }
  return "the step";
}

const char* to_string(OomCause cause) {
  switch (cause) {
    case OomCause::kModel:
      return "model";
    case OomCause::kOptimizerState:
      return "optimizer state";
    case OomCause::kBatch:
      return "batch";
    case OomCause::kActivations:
      return "activations";
    case OomCause::kTemporaries:
      return "temporaries";
    case OomCause::kOther:
      break;
  }
  return "other";
}

OomDiagnosis diagnose_oom(OomPhase phase, const OomMemory& m,
                          std::optional<int64_t> budget, bool state_on_host,
                          bool training) {
  OomDiagnosis d;
  std::vector<std::pair<const char*, int64_t>> parts = {
      {"parameters", m.parameters},
      {"gradients", m.gradients},
      {"optimizer state", m.optimizer_state},
      {"the batch", m.batch},
      {"activations", m.activations},
      {"temporaries", m.temporaries},
      {"other", m.other}};
  std::stable_sort(
      parts.begin(), parts.end(),
      [](const auto& a, const auto& b) { return a.second > b.second; });
  for (const auto& [name, bytes] : parts) {
    if (bytes <= 0) continue;
    d.what_fills += (d.what_fills.empty() ? "" : ", ") + std::string(name) +
                    " " + format_bytes(bytes);
  }
  if (d.what_fills.empty()) d.what_fills = "nothing memfit tracked";

  // Training holds a gradient beside every trainable parameter; an
  // evaluation only the gradients it finds.
  const int64_t model =
      m.parameters + (training ? std::max(m.gradients, m.parameters) : m.gradients);
  const bool model_exceeds = budget && model >= *budget;
  if (phase == OomPhase::kParameters || model_exceeds) {
    d.cause = OomCause::kModel;
  } else if (phase == OomPhase::kOptimizerStep) {
    d.cause = OomCause::kOptimizerState;
  } else if (phase == OomPhase::kInputs) {
    d.cause = OomCause::kBatch;
  } else {
    // What grows with the batch, the largest of it; else the largest part.
    const std::pair<OomCause, int64_t> grows[] = {
        {OomCause::kBatch, m.batch},
        {OomCause::kActivations, m.activations},
        {OomCause::kTemporaries, m.temporaries},
        {OomCause::kOther, m.other}};
    const auto top = std::max_element(
        std::begin(grows), std::end(grows),
        [](const auto& a, const auto& b) { return a.second < b.second; });
    if (top->second > 0 && top->second * 2 >= m.optimizer_state) {
      d.cause = top->first;
    } else if (m.optimizer_state > 0) {
      d.cause = OomCause::kOptimizerState;
    } else if (top->second > 0) {
      d.cause = top->first;
    } else {
      d.cause = phase == OomPhase::kBackward ? OomCause::kActivations
                                             : OomCause::kModel;
    }
  }
  switch (d.cause) {
    case OomCause::kModel:
      d.advice = kModelAdvice;
      break;
    case OomCause::kOptimizerState:
      d.advice = state_on_host ? kStateOnHostAdvice : kStateAdvice;
      break;
    case OomCause::kBatch:
      d.advice = kBatchAdvice;
      break;
    case OomCause::kActivations:
      d.advice = kActivationsAdvice;
      break;
    case OomCause::kTemporaries:
      d.advice = kTemporariesAdvice;
      break;
    case OomCause::kOther:
      d.advice = kOtherAdvice;
      break;
  }
  return d;
}

std::string oom_message(const std::string& operation, const std::string& what,
                        OomPhase phase, const OomDiagnosis& d,
                        const std::string& detail) {
  std::string msg = "CUDA out of memory. [" + operation + "] " +
                    (what.empty() ? "ran" : what + ": it ran") + " out in " +
                    to_string(phase) + ", with " + d.what_fills +
                    " on the device. " + d.advice;
  if (!detail.empty()) msg += " " + detail;
  return msg;
}

OomExplanation explain_oom(const std::string& operation, const std::string& what,
                           OomPhase phase, const OomMemory& memory,
                           std::optional<int64_t> budget, bool state_on_host,
                           const std::string& detail, bool training) {
  OomExplanation e;
  e.phase = phase;
  e.diagnosis = diagnose_oom(phase, memory, budget, state_on_host, training);
  e.message = oom_message(operation, what, phase, e.diagnosis, detail);
  return e;
}

std::string allocator_figures(const std::string& oom) {
  std::string s = oom.substr(0, oom.find('\n'));
  const std::string cuda = "CUDA out of memory.";
  const auto at = s.find(cuda);
  if (at != std::string::npos) s.erase(0, at + cuda.size());
  s = s.substr(0, s.find(" Use a smaller batch"));
  const auto first = s.find_first_not_of(' ');
  return first == std::string::npos ? "" : s.substr(first);
}

}  // namespace memfit
