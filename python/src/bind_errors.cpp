// C++ exceptions -> the Python exceptions a PyTorch user expects.
#include <c10/util/Exception.h>

#include "bindings.h"

namespace py = pybind11;

namespace memfit::python {

void init_errors(py::module_& m) {
  (void)m;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::OutOfMemoryError& e) {
      // torch.cuda.OutOfMemoryError, as a full GPU raises it.
      py::object oom = py::module_::import("torch.cuda").attr("OutOfMemoryError");
      PyErr_SetString(oom.ptr(), e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    }
  });
}

}  // namespace memfit::python
