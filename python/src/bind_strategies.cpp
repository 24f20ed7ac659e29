// The checkpointing planner of core/checkpoint_plan.h, for memfit.advise:
// Python measures the chain on the user's model, C++ plans over it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "memfit/core/checkpoint_plan.h"

namespace py = pybind11;

namespace memfit::python {

void init_strategies(py::module_& m) {
  py::class_<ChainSegment>(m, "ChainSegment")
      .def(py::init([](std::string name, int64_t activation_bytes,
                       int64_t input_bytes, int64_t backward_extra_bytes,
                       double recompute_ns) {
             return ChainSegment{std::move(name), activation_bytes, input_bytes,
                                 backward_extra_bytes, recompute_ns};
           }),
           py::arg("name") = "", py::arg("activation_bytes") = 0,
           py::arg("input_bytes") = 0, py::arg("backward_extra_bytes") = 0,
           py::arg("recompute_ns") = 0.0)
      .def_readwrite("name", &ChainSegment::name)
      .def_readwrite("activation_bytes", &ChainSegment::activation_bytes)
      .def_readwrite("input_bytes", &ChainSegment::input_bytes)
      .def_readwrite("backward_extra_bytes",
                     &ChainSegment::backward_extra_bytes)
      .def_readwrite("recompute_ns", &ChainSegment::recompute_ns)
      .def("__repr__", [](const ChainSegment& c) {
        return "ChainSegment(" + quoted(c.name) + ", activation_bytes=" +
               std::to_string(c.activation_bytes) + ", input_bytes=" +
               std::to_string(c.input_bytes) + ")";
      });

  py::class_<ChainMemory>(m, "ChainMemory")
      .def(py::init([](int64_t forward_fixed, int64_t backward_fixed,
                       int64_t other_peak) {
             return ChainMemory{forward_fixed, backward_fixed, other_peak};
           }),
           py::arg("forward_fixed") = 0, py::arg("backward_fixed") = 0,
           py::arg("other_peak") = 0)
      .def_readwrite("forward_fixed", &ChainMemory::forward_fixed)
      .def_readwrite("backward_fixed", &ChainMemory::backward_fixed)
      .def_readwrite("other_peak", &ChainMemory::other_peak)
      .def("__repr__", [](const ChainMemory& c) {
        return "ChainMemory(forward_fixed=" + std::to_string(c.forward_fixed) +
               ", backward_fixed=" + std::to_string(c.backward_fixed) +
               ", other_peak=" + std::to_string(c.other_peak) + ")";
      });

  py::class_<ChainPlan>(m, "ChainPlan")
      .def_readonly("rule", &ChainPlan::rule)
      .def_readonly("checkpointed", &ChainPlan::checkpointed)
      .def_readonly("predicted_peak", &ChainPlan::predicted_peak)
      .def_readonly("recompute_ns", &ChainPlan::recompute_ns)
      .def_readonly("fits", &ChainPlan::fits)
      .def("count", &ChainPlan::count)
      .def("indices", &ChainPlan::indices)
      .def("__repr__", [](const ChainPlan& p) {
        return "ChainPlan(" + quoted(p.rule) + ", blocks=" + quoted(p.indices()) +
               ", predicted_peak=" + std::to_string(p.predicted_peak) +
               ", fits=" + (p.fits ? std::string("True") : std::string("False")) + ")";
      });

  m.def("chain_peak", &chain_peak, py::arg("segments"), py::arg("memory"),
        py::arg("checkpointed"),
        "Predicted peak of a choice. See Note [The chain's memory model].");
  m.def("chain_recompute_ns", &chain_recompute_ns, py::arg("segments"),
        py::arg("checkpointed"));
  m.def("chain_plan_none", &chain_plan_none, py::arg("segments"),
        py::arg("memory"), py::arg("budget"));
  m.def("chain_plan_every_k", &chain_plan_every_k, py::arg("segments"),
        py::arg("memory"), py::arg("budget"), py::arg("k"));
  m.def("chain_plan_sqrt", &chain_plan_sqrt, py::arg("segments"),
        py::arg("memory"), py::arg("budget"));
  m.def("chain_plan_optimal", &chain_plan_optimal, py::arg("segments"),
        py::arg("memory"), py::arg("budget"),
        "The least recompute whose predicted peak fits the budget (dynamic "
        "programming); fits is false when no choice does.");
  m.def("compare_chain_plans", &compare_chain_plans, py::arg("segments"),
        py::arg("memory"), py::arg("budget"));
}

}  // namespace memfit::python
