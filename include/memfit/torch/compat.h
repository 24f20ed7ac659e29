// Every difference between the torch versions memfit builds against lives
// here: Debian's torch 1.13 (development, CI) and torch 2.x (users, GPUs).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <torch/version.h>

#define MEMFIT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||         \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// torch 2.3 made c10::Allocator::allocate non-const and added the pure
// virtual copy_data; before, allocate was const and there was no copy_data.
#if MEMFIT_TORCH_AT_LEAST(2, 3)
#define MEMFIT_ALLOCATE_CONST
#define MEMFIT_HAS_COPY_DATA 1
#else
#define MEMFIT_ALLOCATE_CONST const
#define MEMFIT_HAS_COPY_DATA 0
#endif

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
// ends, as torch.autocast does. torch 2.4 replaced set_cpu_enabled and
// set_autocast_cpu_dtype with set_autocast_enabled/_dtype(device, ...).
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

// c10::Allocator::allocate through a pointer whose constness differs between
// versions.
inline c10::DataPtr allocate(c10::Allocator* allocator, size_t n) {
  return allocator->allocate(n);
}

}  // namespace memfit::compat
