#include <pybind11/functional.h>
#include <pybind11/pybind11.h>

#include <utility>

#include "bindings.h"
#include "memfit/core/step_protocol.h"

namespace py = pybind11;

namespace memfit::python {

void init_step_protocol(py::module_& m) {
  // Called from Python, so the GIL is held throughout: the callbacks are
  // Python callables and the protocol never lets it go.
  m.def(
      "run_step_protocol",
      [](StepCallbacks::PhaseFn begin_phase, StepCallbacks::Fn materialize,
         StepCallbacks::Fn inputs, StepCallbacks::Fn forward,
         StepCallbacks::Fn loss, StepCallbacks::Fn backward,
         StepCallbacks::Fn optimizer_step, StepCallbacks::Fn zero_grad,
         StepCallbacks::Fn end_phase, int iterations, bool train,
         const Progress& progress, const std::string& what) {
        StepCallbacks cb;
        cb.train = train;
        cb.has_optimizer = static_cast<bool>(optimizer_step);
        cb.begin_phase = std::move(begin_phase);
        cb.materialize = std::move(materialize);
        cb.inputs = std::move(inputs);
        cb.forward = std::move(forward);
        cb.loss = std::move(loss);
        cb.backward = std::move(backward);
        cb.optimizer_step = std::move(optimizer_step);
        cb.zero_grad = std::move(zero_grad);
        cb.end_phase = std::move(end_phase);
        run_step_protocol(cb, iterations, progress, what);
      },
      py::arg("begin_phase"), py::arg("materialize"), py::arg("inputs"),
      py::arg("forward"), py::arg("loss"), py::arg("backward"),
      py::arg("optimizer_step"), py::arg("zero_grad"), py::arg("end_phase"),
      py::kw_only(), py::arg("iterations"), py::arg("train") = true,
      py::arg("progress") = Progress(), py::arg("what") = "record",
      "The recorded step's phases in memfit's order (core/step_protocol.h): "
      "begin_phase(name, iteration) opens each, then its callable runs; "
      "optimizer_step=None: no optimizer step.");
}

}  // namespace memfit::python
