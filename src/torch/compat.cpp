#include "memfit/torch/compat.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/variable.h>

#include <mutex>

namespace memfit::compat {

void set_data_any_device(const at::Tensor& variable, const at::Tensor& data) {
  TORCH_CHECK(variable.defined() && data.defined(),
              "[set_data_any_device] both tensors must be defined");
  TORCH_CHECK(variable.dtype() == data.dtype(),
              "[set_data_any_device] dtype ", variable.dtype(), " != ", data.dtype());
  // See Note [Moving a parameter across devices in place].
  variable.unsafeGetTensorImpl()->shallow_copy_from(data.getIntrusivePtr());
  // As set_data does: a cached gradient accumulator expects the old device.
  if (auto* meta = torch::autograd::impl::get_autograd_meta(variable)) {
    std::lock_guard<std::mutex> lock(meta->mutex_);
    meta->grad_accumulator_.reset();
  }
}

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

}  // namespace memfit::compat
