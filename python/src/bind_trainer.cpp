// Trainer, its chunk schedule (also memfit.lazy's), and OOM explanations. Python callables become the C++ callbacks; the
// step runs without the GIL (autograd's device threads may need it for
// Python functions) and each callback takes it back.
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "memfit/core/batch_fit.h"
#include "memfit/core/chunk_coverage.h"
#include "memfit/core/chunk_schedule.h"
#include "memfit/core/oom_cause.h"
#include "memfit/torch/trainer.h"

namespace py = pybind11;

namespace memfit::python {
namespace {

// A Python OOM raised inside a callback, as the C++ OOM the Trainer
// recovers from. Leaving this scope drops the Python exception, and with it
// its traceback and every tensor the failed micro-batch's frames held.
[[noreturn]] void rethrow_as_cpp(py::error_already_set& e) {
  py::object oom = py::module_::import("torch.cuda").attr("OutOfMemoryError");
  if (e.matches(oom)) {
    const std::string msg = e.what();
    C10_THROW_ERROR(OutOfMemoryError, msg);
  }
  throw;
}

}  // namespace

void init_trainer(py::module_& m) {
  // The schedule memfit.lazy drives its chunks with, as the Trainer does.
  py::class_<Chunk>(m, "Chunk")
      .def(py::init([](int64_t start, int64_t size) { return Chunk{start, size}; }),
           py::arg("start"), py::arg("size"))
      .def_readonly("start", &Chunk::start)
      .def_readonly("size", &Chunk::size)
      .def("__repr__", [](const Chunk& c) {
        return "Chunk(start=" + std::to_string(c.start) + ", size=" + std::to_string(c.size) +
               ")";
      });
  py::class_<ChunkSchedule>(m, "ChunkSchedule",
                            "Balanced chunks of a batch, an OOM halved and redone "
                            "(see include/memfit/core/chunk_schedule.h).")
      .def(py::init<int64_t, int64_t, bool>(), py::arg("batch"), py::arg("limit"),
           py::arg("can_split") = true)
      .def_property_readonly("done", &ChunkSchedule::done)
      .def("next", &ChunkSchedule::next, "The chunk to run now.")
      .def("succeeded", &ChunkSchedule::succeeded, "It completed: move past it.")
      .def("failed", &ChunkSchedule::failed,
           "It ran out of memory: True when it is redone smaller, False when the "
           "schedule cannot go on.")
      .def_property_readonly("position", &ChunkSchedule::position)
      .def_property_readonly("size", &ChunkSchedule::size)
      .def_property_readonly("ooms_recovered", &ChunkSchedule::ooms_recovered);
  py::class_<ChunkCoverage>(m, "ChunkCoverage",
                            "Which gradients (by index) a chunk still owes its samples to "
                            "(see include/memfit/core/chunk_coverage.h).")
      .def(py::init<size_t>(), py::arg("items"))
      .def("owed", &ChunkCoverage::owed, py::arg("chunk"))
      .def("add", &ChunkCoverage::add, py::arg("chunk"), py::arg("items"));

  py::class_<StepReport>(m, "StepReport")
      .def_readonly("batch", &StepReport::batch)
      .def_readonly("micro_batch", &StepReport::micro_batch)
      .def_readonly("micro_batches", &StepReport::micro_batches)
      .def_readonly("ooms_recovered", &StepReport::ooms_recovered)
      .def_readonly("samples", &StepReport::samples)
      .def_readwrite("loss", &StepReport::loss)
      .def_readonly("peak_bytes", &StepReport::peak_bytes)
      .def_readonly("chunks", &StepReport::chunks)
      .def_readwrite("notes", &StepReport::notes)
      .def("__repr__", [](const StepReport& r) {
        return "StepReport(batch=" + std::to_string(r.batch) + ", micro_batch=" +
               std::to_string(r.micro_batch) + ", micro_batches=" +
               std::to_string(r.micro_batches) + ", ooms_recovered=" +
               std::to_string(r.ooms_recovered) + ", loss=" + std::to_string(r.loss) +
               ", peak_bytes=" + std::to_string(r.peak_bytes) + ")";
      });

  py::class_<Trainer>(m, "Trainer")
      .def(py::init([](std::vector<at::Tensor> params, py::function optimizer_step,
                       std::optional<int64_t> budget, bool split, bool allow_coupled,
                       bool mean_loss, int64_t micro_batch,
                       std::vector<std::string> coupled_layers) {
             TrainerOptions o;
             o.budget = budget;
             o.split = split;
             o.coupled = allow_coupled ? CoupledLayers::kAllow : CoupledLayers::kError;
             o.mean_loss = mean_loss;
             o.micro_batch = micro_batch;
             // The callable lives as long as the Trainer (kept by the Python
             // wrapper too); called with the GIL taken back.
             auto step = std::make_shared<py::function>(optimizer_step);
             return std::make_unique<Trainer>(
                 std::move(params),
                 [step] {
                   py::gil_scoped_acquire gil;
                   try {
                     (*step)();
                   } catch (py::error_already_set& e) {
                     rethrow_as_cpp(e);
                   }
                 },
                 o, std::move(coupled_layers));
           }),
           py::arg("params"), py::arg("optimizer_step"), py::arg("budget"),
           py::arg("split"), py::arg("allow_coupled"), py::arg("mean_loss"),
           py::arg("micro_batch"), py::arg("coupled_layers"))
      .def("step", [](Trainer& t, int64_t batch, py::function& chunk_loss,
                      int64_t batch_bytes) {
        Trainer::ChunkLoss cb = [&chunk_loss](int64_t start, int64_t count) {
          py::gil_scoped_acquire gil;
          try {
            return chunk_loss(start, count).cast<at::Tensor>();
          } catch (py::error_already_set& e) {
            rethrow_as_cpp(e);
          }
        };
        py::gil_scoped_release release;
        return t.step(batch, cb, batch_bytes);
      }, py::arg("batch"), py::arg("chunk_loss"), py::arg("batch_bytes") = 0)
      .def("set_budget", &Trainer::set_budget, py::arg("budget"))
      .def_property_readonly("budget", &Trainer::budget)
      .def_property_readonly("micro_batch", &Trainer::micro_batch)
      .def("set_micro_batch", &Trainer::set_micro_batch, py::arg("micro_batch"),
           "Start the next step from this many samples (0: the whole batch).");

  m.def(
      "explain_oom",
      [](const std::string& operation, const std::string& what, const std::string& phase,
         int64_t parameters, int64_t gradients, int64_t optimizer_state, int64_t batch,
         int64_t activations, int64_t temporaries, int64_t other,
         std::optional<int64_t> budget, bool state_on_host, const std::string& detail) {
        const OomPhase p = oom_phase_of(phase);
        OomMemory mem;
        mem.parameters = parameters;
        mem.gradients = gradients;
        mem.optimizer_state = optimizer_state;
        mem.batch = batch;
        mem.activations = activations;
        mem.temporaries = temporaries;
        mem.other = other;
        const OomDiagnosis d = diagnose_oom(p, mem, budget, state_on_host);
        return py::make_tuple(to_string(d.cause), oom_message(operation, what, p, d, detail),
                              d.advice, d.what_fills, to_string(p));
      },
      py::arg("operation"), py::arg("what"), py::arg("phase"), py::arg("parameters") = 0,
      py::arg("gradients") = 0, py::arg("optimizer_state") = 0, py::arg("batch") = 0,
      py::arg("activations") = 0, py::arg("temporaries") = 0, py::arg("other") = 0,
      py::arg("budget") = py::none(), py::arg("state_on_host") = false,
      py::arg("detail") = "",
      "(cause, message, advice, what_fills, phase_words) of an OOM: what fills the memory "
      "and the advice that fits it (see include/memfit/core/oom_cause.h). phase: a profile "
      "phase name.");
  m.def("allocator_figures", &allocator_figures, py::arg("message"),
        "An allocator's OOM message without CUDA's words and its generic advice.");
}

}  // namespace memfit::python
