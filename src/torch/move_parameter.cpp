#include "memfit/torch/move_parameter.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/variable.h>

#include <mutex>

namespace memfit {

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

}  // namespace memfit
