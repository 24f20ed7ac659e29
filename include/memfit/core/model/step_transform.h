// A recorded training step turned into the same step under another choice
// that changes only which of its allocations live how long: gradients kept
// and zeroed in place, the optimizer's state and step on the host. What
// advise predicts instead of recording again.
// See Note [Steps predicted from a recording] in step_transform.cpp.
#pragma once

#include <cstdint>
#include <optional>

#include "memfit/core/model/timeline.h"

namespace memfit {

// The step as zero_grad(set_to_none=False) runs it: the gradients of the
// first backward stay live to the end; each later backward's gradient is
// added into them and freed at once. nullopt when `t` has no backward
// whose gradients a zero_grad frees.
std::optional<Timeline> with_gradients_kept(const Timeline& t);

// The step with the optimizer's state and step on the host (Note [Host
// copies of the parameters]): nothing the optimizer_step phase allocates
// is on the device. nullopt when `t` has no optimizer_step phase.
std::optional<Timeline> with_state_on_host(const Timeline& t);

// Bytes live at the peak (the first event reaching it) that no batch size
// changes: parameters and buffers, and gradients and optimizer state made
// in an earlier iteration than the peak's. 0 for an empty timeline.
int64_t batch_independent_at_peak(const Timeline& t);

}  // namespace memfit
