// memfit.NativeMetaKernels: a context manager over the torch layer's
// NativeMetaKernels (include/memfit/torch/native_meta.h). See Note [Native
// meta kernels] in src/torch/native_meta.cpp.
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "memfit/torch/native_meta.h"

namespace memfit::python {
namespace {

// Open while inside `with`; what it skipped stays readable after.
class NativeMetaScope {
 public:
  void open() {
    if (kernels_) return;
    kernels_ = std::make_unique<NativeMetaKernels>(__FILE__, __LINE__);
    skipped_ = kernels_->skipped();
  }
  void close() { kernels_.reset(); }
  bool is_open() const { return kernels_ != nullptr; }
  const std::vector<std::string>& skipped() const { return skipped_; }

 private:
  std::unique_ptr<NativeMetaKernels> kernels_;
  std::vector<std::string> skipped_;
};

}  // namespace

void init_native_meta(pybind11::module_& m) {
  namespace py = pybind11;
  py::class_<NativeMetaScope>(m, "NativeMetaKernels",
                              "torch's C++ meta kernels for the hot aten ops, registered at "
                              "the Meta key while open (a context manager); see Note [Native "
                              "meta kernels] in src/torch/native_meta.cpp")
      .def(py::init<>())
      .def("__enter__", [](NativeMetaScope& k) -> NativeMetaScope& {
        k.open();
        return k;
      }, py::return_value_policy::reference)
      .def("__exit__", [](NativeMetaScope& k, py::args) {
        k.close();
        return false;
      })
      .def_property_readonly("is_open", &NativeMetaScope::is_open,
                             "True inside the with block: the kernels answer the Meta key")
      .def_property_readonly("skipped", &NativeMetaScope::skipped,
                             "ops this torch has not (or with another signature): torch's "
                             "Python kernel answers them");
}

}  // namespace memfit::python
