// The order of one recorded training step, written once: the C++ profile
// (profile.cpp) and the Python one (profiling.py, through the binding) hand
// in what each phase does and get the same phases, in the same order, with
// the same progress lines.
#pragma once

#include <functional>
#include <string>

#include "memfit/core/plan/progress.h"

namespace memfit {

// What a front does at each phase of the step. Each runs right after its
// phase begins (begin_phase). The front keeps the step's tensors itself and
// drops them where its step always has: the output in `loss` (see Note [The
// order of a training iteration], report.h), the rest in `end_phase`.
struct StepCallbacks {
  using PhaseFn = std::function<void(const std::string& phase, int iteration)>;
  using Fn = std::function<void()>;

  bool train = true;          // false: an eval step, which ends after loss
  bool has_optimizer = true;  // false: no optimizer_step phase
  PhaseFn begin_phase;
  Fn materialize;  // "parameters": the weights on the device
  Fn inputs;       // the batch on the device
  Fn forward;
  Fn loss;            // and drops the output
  Fn backward;        // train only
  Fn optimizer_step;  // train with an optimizer only
  Fn zero_grad;       // train only
  // Closes the iteration's last phase, then drops what the iteration held.
  Fn end_phase;
};

// Runs "parameters" once, then `iterations` iterations of inputs, forward,
// loss, backward, optimizer_step, zero_grad (an eval step stops after loss),
// each iteration closed by end_phase. Each phase is said to `progress` as
// "<what>: <phase>", with " (iteration k)" when there are several. Throws
// std::invalid_argument when iterations < 1 or a callback the step needs is
// missing; whatever a callback throws goes through.
void run_step_protocol(const StepCallbacks& callbacks, int iterations,
                       const Progress& progress = Progress(),
                       const std::string& what = "record");

}  // namespace memfit
