// The category an allocation gets from the phase it is made in, until
// something more precise is known: the recorder's first guess
// (Recorder::classify refines it) and a snapshot's, whose frames say only
// the phase.
#pragma once

#include <string_view>

#include "memfit/core/model/event.h"

namespace memfit {

Category default_category(std::string_view phase);

}  // namespace memfit
