#include "memfit/torch/cpu_autocast.h"

#include <ATen/autocast_mode.h>

namespace memfit {

bool cpu_autocast_enabled() { return at::autocast::is_autocast_enabled(at::kCPU); }

at::ScalarType cpu_autocast_dtype() { return at::autocast::get_autocast_dtype(at::kCPU); }

namespace {
void set_cpu_autocast(bool enabled, at::ScalarType dtype) {
  at::autocast::set_autocast_enabled(at::kCPU, enabled);
  at::autocast::set_autocast_dtype(at::kCPU, dtype);
}
}  // namespace

CpuAutocast::CpuAutocast(bool enabled, at::ScalarType dtype)
    : prev_enabled_(cpu_autocast_enabled()), prev_dtype_(cpu_autocast_dtype()) {
  set_cpu_autocast(enabled, enabled ? dtype : prev_dtype_);
  at::autocast::increment_nesting();
}

CpuAutocast::~CpuAutocast() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_cpu_autocast(prev_enabled_, prev_dtype_);
}

}  // namespace memfit
