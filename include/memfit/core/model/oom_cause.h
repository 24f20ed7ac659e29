// What fills the memory when a training step runs out of it, and the advice
// that fits that cause: "use a smaller batch" only when the batch is what
// grows. Shared by the Trainer, batch fitting and advise; free of LibTorch.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "memfit/core/model/event.h"

namespace memfit {

// Where in a training step the memory ran out.
enum class OomPhase {
  kParameters,     // putting the model on the device, before any step
  kInputs,         // moving the batch's data to the device
  kForward,        // forward and loss
  kBackward,       // the backward
  kOptimizerStep,  // the optimizer's step (its state is made on the first)
  kUnknown,
};

// Bytes live on the device when it ran out, by what holds them.
struct OomMemory {
  int64_t parameters = 0;  // the model's weights (the trainable ones)
  int64_t gradients = 0;
  int64_t optimizer_state = 0;
  int64_t batch = 0;        // the batch's own inputs and targets
  int64_t activations = 0;  // saved by the forward for the backward
  int64_t temporaries = 0;  // what an op holds while it runs
  int64_t other = 0;        // anything else the loop holds
  int64_t total() const {
    return parameters + gradients + optimizer_state + batch + activations +
           temporaries + other;
  }
};

// What the advice answers.
enum class OomCause {
  kModel,           // parameters and their gradients alone exceed the memory
  kOptimizerState,  // the optimizer's state (or its step) is the excess
  kBatch,           // the batch's own data
  kActivations,     // what the forward saves
  kTemporaries,     // what ops hold while they run
  kOther,           // what the loop holds beside the step
};

struct OomDiagnosis {
  OomCause cause = OomCause::kOther;
  // "parameters 2.55 MiB, gradients 2.55 MiB, ...": the nonzero parts,
  // largest first.
  std::string what_fills;
  // One or two sentences for that cause; never "a smaller batch" unless
  // the batch or what grows with it is the cause.
  std::string advice;
};

// Classifies an OOM. `budget`: the device's memory, when known.
// `state_on_host`: the optimizer's state already lives on the host (do not
// advise moving it there). `training`: a gradient will sit beside every
// trainable parameter; false for a step with grad disabled (an evaluation),
// where the model alone is its weights and the gradients present.
OomDiagnosis diagnose_oom(OomPhase phase, const OomMemory& memory,
                          std::optional<int64_t> budget,
                          bool state_on_host = false, bool training = true);

// "CUDA out of memory. [operation] <what>: it ran out in <phase>, with
// <what fills> on the device. <advice> <detail>" (without "<what>: it " when
// `what` is empty). `detail`: the allocator's own figures, if any. Starts
// with CUDA's words so that tools matching them (accelerate, Lightning) see
// an OOM.
std::string oom_message(const std::string& operation, const std::string& what,
                        OomPhase phase, const OomDiagnosis& d,
                        const std::string& detail = "");

// What a front says of an OOM: where it ran out, what fills the memory and
// the advice, and the message it raises (oom_message of the diagnosis).
struct OomExplanation {
  OomPhase phase = OomPhase::kUnknown;
  OomDiagnosis diagnosis;
  std::string message;
};
OomExplanation explain_oom(const std::string& operation, const std::string& what,
                           OomPhase phase, const OomMemory& memory,
                           std::optional<int64_t> budget, bool state_on_host = false,
                           const std::string& detail = "", bool training = true);

// An allocator's OOM message without its leading "CUDA out of memory." and
// its generic "Use a smaller batch ..." advice: the figures only.
std::string allocator_figures(const std::string& oom);

// A profile's phase name ("forward", "loss", "backward", "optimizer_step",
// "inputs", "parameters") as an OomPhase; kUnknown for others.
OomPhase oom_phase_of(std::string_view profile_phase);

// A profile's bytes by category (Report::categories_at_peak) as OomMemory:
// buffers count as parameters, inputs as the batch.
OomMemory oom_memory_of(const std::array<int64_t, kNumCategories>& by_category);

const char* to_string(OomPhase phase);
const char* to_string(OomCause cause);

}  // namespace memfit
