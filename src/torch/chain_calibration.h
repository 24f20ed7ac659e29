// Fills the checkpoint planner's chain model from measured profiles: what
// each block of the chain keeps for backward and how long its forward takes.
// Internal to src/torch (advise); see Note [Calibrating the chain from two
// profiles] in chain_calibration.cpp.
#pragma once

#include <string>
#include <vector>

#include "memfit/core/checkpoint_plan.h"
#include "memfit/torch/profile.h"

namespace memfit::detail {

// `plain` and `all` profile the same step at the same batch, `all` with
// every block of `chain` checkpointed.
void calibrate(const Profile& plain, const Profile& all,
               const std::vector<std::string>& chain,
               std::vector<ChainSegment>& segments, ChainMemory& memory);

}  // namespace memfit::detail
