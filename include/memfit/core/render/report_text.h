// How a Report reads: the table `memfit profile` prints and its JSON, for
// both fronts (memfit.profile's Report.table() and to_json() are these).
#pragma once

#include <cstddef>
#include <string>

#include "memfit/core/model/report.h"

namespace memfit {

// The table people read: phases, then categories at the peak, then the
// largest `max_modules` modules (and the CUDA estimate and ranks when made).
std::string to_text(const Report& report, size_t max_modules = 10);

// Top-level keys: model, batch, optimizer, mode, peak_bytes, phases,
// categories_at_peak, modules (and cuda, data_parallel when estimated).
std::string to_json(const Report& report, bool pretty = true);

}  // namespace memfit
