#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "memfit/core/model/units.h"

namespace py = pybind11;

namespace memfit::python {

void init_units(py::module_& m) {
  m.def("parse_size", &parse_size, py::arg("text"),
        "Bytes in a size written as '16GiB', '512MiB' or '1048576'.");
  m.def("format_bytes", &format_bytes, py::arg("bytes"),
        "A byte count for people: 4000000 -> '3.81 MiB'.");
}

}  // namespace memfit::python
