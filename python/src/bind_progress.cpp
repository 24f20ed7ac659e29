#include <pybind11/functional.h>
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "memfit/core/plan/progress.h"

namespace py = pybind11;

namespace memfit::python {

void init_progress(py::module_& m) {
  // The sink is called with the GIL: pybind11's std::function wrapper
  // takes it for every call of a Python callable.
  py::class_<Progress>(m, "Progress")
      .def(py::init<>(), "Silent.")
      .def(py::init<Progress::Sink>(), py::arg("sink"),
           "Each step's line, stamped with the seconds since now, goes to "
           "sink(line).")
      .def_property_readonly("enabled", &Progress::enabled, "False for a silent Progress")
      .def("step", &Progress::step, py::arg("what"),
           "sink('[  2.4s] ' + what), when not silent.");
}

}  // namespace memfit::python
