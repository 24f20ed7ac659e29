// The order of one recorded training step, written once: the C++ profile
// (profile.cpp) and the Python one (_step/record.py, through the binding) hand
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

// Note [The loop the user runs]
// Users size a batch for their own loop, and loops differ in what they hold
// beside a step's activations:
// - accumulation_steps > 1: the optimizer steps once every N micro-batches,
//   so the gradients of the earlier ones are alive through the later ones'
//   forward and backward. Every micro-batch after the second holds what the
//   second held, so two are recorded per optimizer step: the peak of N is
//   the peak of two, at half the recording's cost of N.
// - zero_grad_first (the tutorial order `loss = ...; opt.zero_grad();
//   loss.backward(); opt.step()`): the last step's gradients are alive
//   through the next forward and loss, and freed just before backward.
// Each micro-batch is an iteration of its own in the recording (its phases
// say "iteration k"); set_to_none is the front's zero_grad callback's.
struct LoopShape {
  int accumulation_steps = 1;    // micro-batches per optimizer step
  bool zero_grad_first = false;  // zero_grad before backward, not after the step

  // The micro-batches recorded per optimizer step: see the Note above.
  int recorded_micro_batches() const {
    return accumulation_steps > 1 ? 2 : 1;
  }
};

// Runs "parameters" once, then `iterations` optimizer steps of `loop`'s
// shape: each micro-batch runs inputs, forward, loss, backward, and the
// last of each step optimizer_step and zero_grad (zero_grad before backward
// in the tutorial order); an eval step stops after loss. Each micro-batch is
// closed by end_phase. Each phase is said to `progress` as "<what>:
// <phase>", with " (iteration k)" when there are several. Throws
// std::invalid_argument when iterations < 1, accumulation_steps < 1 or a
// callback the step needs is missing; whatever a callback throws goes
// through.
void run_step_protocol(const StepCallbacks& callbacks, int iterations,
                       const Progress& progress = Progress(),
                       const std::string& what = "record",
                       const LoopShape& loop = LoopShape());

}  // namespace memfit
