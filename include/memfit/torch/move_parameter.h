// A parameter moved to another device in place, keeping the object that
// optimizers and hooks hold.
#pragma once

#include <ATen/core/Tensor.h>

namespace memfit {

// Note [Moving a parameter across devices in place]
// Variable::set_data refuses data of another tensor type (CPU -> Meta), and
// Python's `p.data = ...` goes through the same check. Module.to() in Python
// gets round it by replacing the Parameter, which would cut the optimizer's
// references. memfit needs the same Parameter object on another device for
// a meta-mode profile, so it does what set_data does after its check: a
// shallow copy of the new tensor's metadata and storage into the variable.
void set_data_any_device(const at::Tensor& variable, const at::Tensor& data);

}  // namespace memfit
