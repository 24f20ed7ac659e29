#include <pybind11/functional.h>
#include <pybind11/pybind11.h>

#include <utility>

#include "bindings.h"
#include "memfit/core/plan/step_protocol.h"

namespace py = pybind11;

namespace memfit::python {

void init_step_protocol(py::module_& m) {
  py::class_<StepCallbacks>(m, "StepCallbacks",
                            "What a front does at each phase of the recorded step "
                            "(core/plan/step_protocol.h): each callable runs right after "
                            "its phase begins.")
      .def(py::init([](StepCallbacks::PhaseFn begin_phase, StepCallbacks::Fn materialize,
                       StepCallbacks::Fn inputs, StepCallbacks::Fn forward,
                       StepCallbacks::Fn loss, StepCallbacks::Fn end_phase,
                       StepCallbacks::Fn backward, StepCallbacks::Fn optimizer_step,
                       StepCallbacks::Fn zero_grad, bool train) {
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
             return cb;
           }),
           py::kw_only(), py::arg("begin_phase"), py::arg("materialize"), py::arg("inputs"),
           py::arg("forward"), py::arg("loss"), py::arg("end_phase"),
           py::arg("backward") = py::none(), py::arg("optimizer_step") = py::none(),
           py::arg("zero_grad") = py::none(), py::arg("train") = true,
           "optimizer_step=None: no optimizer step (has_optimizer False); backward and "
           "zero_grad may be None for an eval step (train=False).")
      .def_readwrite("train", &StepCallbacks::train,
                     "False: an eval step, which ends after loss")
      .def_readwrite("has_optimizer", &StepCallbacks::has_optimizer,
                     "False: no optimizer_step phase")
      .def_readwrite("begin_phase", &StepCallbacks::begin_phase,
                     "begin_phase(name, iteration): opens each phase")
      .def_readwrite("materialize", &StepCallbacks::materialize,
                     "'parameters': puts the weights on the device")
      .def_readwrite("inputs", &StepCallbacks::inputs, "puts the batch on the device")
      .def_readwrite("forward", &StepCallbacks::forward, "runs the forward")
      .def_readwrite("loss", &StepCallbacks::loss, "computes the loss and drops the output")
      .def_readwrite("backward", &StepCallbacks::backward, "runs the backward (train only)")
      .def_readwrite("optimizer_step", &StepCallbacks::optimizer_step,
                     "steps the optimizer (train with an optimizer only)")
      .def_readwrite("zero_grad", &StepCallbacks::zero_grad, "zeroes the gradients (train only)")
      .def_readwrite("end_phase", &StepCallbacks::end_phase,
                     "closes the iteration's last phase, then drops what it held");

  // Called from Python, so the GIL is held throughout: the callbacks are
  // Python callables and the protocol never lets it go.
  m.def(
      "run_step_protocol",
      [](const StepCallbacks& cb, int iterations, const Progress& progress,
         const std::string& what, int accumulation_steps, bool zero_grad_first) {
        LoopShape loop;
        loop.accumulation_steps = accumulation_steps;
        loop.zero_grad_first = zero_grad_first;
        run_step_protocol(cb, iterations, progress, what, loop);
      },
      py::arg("callbacks"), py::kw_only(), py::arg("iterations"),
      py::arg("progress") = Progress(), py::arg("what") = "record",
      py::arg("accumulation_steps") = 1, py::arg("zero_grad_first") = false,
      "The recorded step's phases in memfit's order (core/plan/step_protocol.h): "
      "'parameters' once, then each iteration's phases, each said to progress as "
      "'<what>: <phase>'; accumulation_steps and zero_grad_first: the user's loop, "
      "Note [The loop the user runs].");
}

}  // namespace memfit::python
