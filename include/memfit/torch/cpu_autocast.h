// CPU autocast regions from C++, as torch.autocast("cpu") opens them.
#pragma once

#include <c10/core/ScalarType.h>

namespace memfit {

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

}  // namespace memfit
