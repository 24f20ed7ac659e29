// memfit._memfit.FlopCount: the torch layer's FlopCount
// (include/memfit/torch/flop_count.h), open while its Python owner counts.
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "memfit/torch/flop_count.h"

namespace memfit::python {

void init_flop_count(pybind11::module_& m) {
  namespace py = pybind11;
  py::class_<FlopCount>(m, "FlopCount",
                        "FLOPs of mm, addmm, bmm and baddbmm counted from the ops a step "
                        "runs; see Note [FLOPs counted while a step is recorded]")
      .def(py::init<const std::vector<std::string>&>(), py::arg("registry_ops"))
      .def("set_counting", &FlopCount::set_counting, py::arg("on"))
      .def("set_block", &FlopCount::set_block, py::arg("block"))
      .def("reset", &FlopCount::reset)
      .def("stop", &FlopCount::stop)
      .def_property_readonly("total", &FlopCount::total)
      .def_property_readonly("by_block", &FlopCount::by_block)
      .def_property_readonly("uncounted", &FlopCount::uncounted);
}

}  // namespace memfit::python
