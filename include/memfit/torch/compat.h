// Every difference between the torch 2.x versions memfit builds against
// (>= 2.4: pip's wheels, CI's 2.13, the GPU machines' 2.11) lives here.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/version.h>

#include <memory>
#include <type_traits>
#include <utility>

static_assert(TORCH_VERSION_MAJOR >= 2 && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 4),
              "memfit needs torch >= 2.4");

namespace memfit::compat {

// Note [Moving a parameter across devices in place]
// Variable::set_data refuses data of another tensor type (CPU -> Meta), and
// Python's `p.data = ...` goes through the same check. Module.to() in Python
// gets round it by replacing the Parameter, which would cut the optimizer's
// references. memfit needs the same Parameter object on another device for
// a meta-mode profile, so it does what set_data does after its check: a
// shallow copy of the new tensor's metadata and storage into the variable.
void set_data_any_device(const at::Tensor& variable, const at::Tensor& data);

// CPU autocast on (in `dtype`) or off while alive, restoring what it found;
// nested regions share the cast-weight cache, cleared when the outermost
// ends, as torch.autocast does.
class CpuAutocast {
 public:
  explicit CpuAutocast(bool enabled, at::ScalarType dtype = at::kBFloat16);
  ~CpuAutocast();
  CpuAutocast(const CpuAutocast&) = delete;
  CpuAutocast& operator=(const CpuAutocast&) = delete;

 private:
  bool prev_enabled_;
  at::ScalarType prev_dtype_;
};
bool cpu_autocast_enabled();
at::ScalarType cpu_autocast_dtype();

// A new autograd node of type T. torch 2.13 made torch::autograd::Node an
// intrusive_ptr_target (set_history takes c10::intrusive_ptr<Node>) and
// dropped deleteNode; before, nodes were held by std::shared_ptr. Decided
// from the type itself, so any 2.x compiles.
template <typename T>
auto make_node() {
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, T>) {
    return c10::make_intrusive<T>();
  } else {
    return std::make_shared<T>();
  }
}

}  // namespace memfit::compat
