// torch's C++ meta kernels for the ops a training step runs most, at the
// Meta key while memfit records on the meta device; and, where nothing
// answers the Meta key for an op the built-in models run (a process without
// torch's Python package), kernels that size its outputs. Meta-mode
// recording (profile.cpp) opens one; Python's memfit.NativeMetaKernels is
// the same object. See Note [Native meta kernels] in native_meta.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torch {
class Library;
}  // namespace torch

namespace memfit {

// Registered while the object lives; its end destroys the registrations and
// the dispatcher answers as it did before. Objects may nest (the innermost
// answers). `file` and `line` name the opener in the dispatcher's table
// (torch._C._dispatch_dump): by default the line that made it.
class NativeMetaKernels {
 public:
  explicit NativeMetaKernels(const char* file = __builtin_FILE(),
                             uint32_t line = __builtin_LINE());
  ~NativeMetaKernels();
  NativeMetaKernels(const NativeMetaKernels&) = delete;
  NativeMetaKernels& operator=(const NativeMetaKernels&) = delete;

  // Ops this torch has not, or has with another signature: whatever
  // answered them before still does.
  const std::vector<std::string>& skipped() const { return skipped_; }
  // Ops that had no kernel at the Meta key and got memfit's (relu,
  // convolution, ... in a process without torch's Python package); empty
  // where torch's Python meta kernels are loaded.
  const std::vector<std::string>& filled() const { return filled_; }

 private:
  std::unique_ptr<torch::Library> torch_kernels_;  // torch's own, in front
  std::unique_ptr<torch::Library> fill_ins_;       // only where none answered
  std::vector<std::string> skipped_;
  std::vector<std::string> filled_;
};

}  // namespace memfit
