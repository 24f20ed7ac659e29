#include "memfit/core/plan/step_protocol.h"

#include <stdexcept>
#include <string>

#include "memfit/core/model/report.h"

namespace memfit {

namespace {

void check(const StepCallbacks& cb, int iterations, const LoopShape& loop) {
  if (iterations < 1) {
    throw std::invalid_argument(
        "[run_step_protocol] iterations must be >= 1, got " +
        std::to_string(iterations));
  }
  if (loop.accumulation_steps < 1) {
    throw std::invalid_argument(
        "[run_step_protocol] accumulation_steps must be >= 1, got " +
        std::to_string(loop.accumulation_steps));
  }
  const char* missing = nullptr;
  if (!cb.begin_phase)
    missing = "begin_phase";
  else if (!cb.materialize)
    missing = "materialize";
  else if (!cb.inputs)
    missing = "inputs";
  else if (!cb.forward)
    missing = "forward";
  else if (!cb.loss)
    missing = "loss";
  else if (!cb.end_phase)
    missing = "end_phase";
  else if (cb.train && !cb.backward)
    missing = "backward";
  else if (cb.train && cb.has_optimizer && !cb.optimizer_step)
    missing = "optimizer_step";
  else if (cb.train && !cb.zero_grad)
    missing = "zero_grad";
  if (missing) {
    throw std::invalid_argument(
        std::string("[run_step_protocol] no ") + missing +
        " callback: give one for every phase the step runs");
  }
}

}  // namespace

void run_step_protocol(const StepCallbacks& cb, int iterations,
                       const Progress& progress, const std::string& what,
                       const LoopShape& loop) {
  check(cb, iterations, loop);
  const int micro = cb.train ? loop.recorded_micro_batches() : 1;
  const int total = iterations * micro;
  auto begin = [&](const std::string& phase, int it) {
    cb.begin_phase(phase, it);
    if (!progress.enabled()) return;
    const bool per_iteration = total > 1 && phase != kPhaseParameters;
    progress.step(what + ": " + phase +
                  (per_iteration ? " (iteration " + std::to_string(it) + ")"
                                 : std::string()));
  };
  begin(kPhaseParameters, 1);
  cb.materialize();
  // See Note [The loop the user runs].
  for (int it = 1; it <= total; ++it) {
    const bool first_of_step = (it - 1) % micro == 0;
    const bool last_of_step = it % micro == 0;
    begin(kPhaseInputs, it);
    cb.inputs();
    begin(kPhaseForward, it);
    cb.forward();
    begin(kPhaseLoss, it);
    cb.loss();
    if (cb.train) {
      if (loop.zero_grad_first && first_of_step) {
        begin(kPhaseZeroGrad, it);
        cb.zero_grad();
      }
      begin(kPhaseBackward, it);
      cb.backward();
      if (last_of_step) {
        if (cb.has_optimizer) {
          begin(kPhaseOptimizerStep, it);
          cb.optimizer_step();
        }
        // See Note [The order of a training iteration] (report.h).
        if (!loop.zero_grad_first) {
          begin(kPhaseZeroGrad, it);
          cb.zero_grad();
        }
      }
    }
    cb.end_phase();
  }
}

}  // namespace memfit
