// Fills the checkpoint planner's chain model (core/plan/checkpoint_plan.h) from
// recorded steps: what each block of the chain keeps for backward and how
// long its forward takes. Torch-free: both fronts (the C++ built-in models
// and Python nn.Modules) record a Timeline and a Report and call this. See
// Note [Calibrating the chain from two profiles] in chain_calibration.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memfit/core/model/report.h"
#include "memfit/core/model/timeline.h"
#include "memfit/core/plan/checkpoint_plan.h"

namespace memfit {

// Activation bytes each block of `chain` (module paths; a block owns its
// path and everything under it) holds at the end of the last forward.
std::vector<int64_t> block_activations(const Timeline& t,
                                       const std::vector<std::string>& chain);

// Each block's forward time in the last forward recorded (ns, at least 1):
// the price of recomputing it. Only the proportions matter to the plan.
std::vector<double> block_forward_ns(const Timeline& t,
                                     const std::vector<std::string>& chain);

// `plain` and `every` record the same step at the same batch, `every` with
// every block of `chain` checkpointed; `forward_ns` is each block's forward
// time (block_forward_ns of a step recorded on a real device).
void calibrate_chain(const Report& plain, const Timeline& plain_timeline,
                     const Report& every, const Timeline& every_timeline,
                     const std::vector<std::string>& chain,
                     const std::vector<double>& forward_ns,
                     std::vector<ChainSegment>& segments, ChainMemory& memory);

}  // namespace memfit
