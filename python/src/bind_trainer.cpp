// Trainer, its chunk schedule (also memfit.lazy's), and OOM explanations. Python callables become the C++ callbacks; the
// step runs without the GIL (autograd's device threads may need it for
// Python functions) and each callback takes it back.
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "memfit/core/model/chunk_coverage.h"
#include "memfit/core/model/chunk_schedule.h"
#include "memfit/core/model/oom_cause.h"
#include "memfit/core/plan/batch_fit.h"
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

// "error" or "allow", as TrainerOptions.coupled reads in Python.
CoupledLayers coupled_layers_from(const std::string& name) {
  if (name == "error") return CoupledLayers::kError;
  if (name == "allow") return CoupledLayers::kAllow;
  throw std::invalid_argument("[Trainer] coupled must be 'error' or 'allow', got '" + name + "'");
}

const char* to_string(CoupledLayers c) { return c == CoupledLayers::kAllow ? "allow" : "error"; }

}  // namespace

void init_trainer(py::module_& m) {
  // The schedule memfit.lazy drives its chunks with, as the Trainer does.
  py::class_<Chunk>(m, "Chunk")
      .def(py::init([](int64_t start, int64_t size) { return Chunk{start, size}; }),
           py::arg("start"), py::arg("size"))
      .def_readonly("start", &Chunk::start, "the chunk's first sample")
      .def_readonly("size", &Chunk::size, "its samples")
      .def("__repr__", [](const Chunk& c) {
        return "Chunk(start=" + std::to_string(c.start) + ", size=" + std::to_string(c.size) +
               ")";
      });
  py::class_<ChunkSchedule>(m, "ChunkSchedule",
                            "Balanced chunks of a batch, an OOM halved and redone "
                            "(see include/memfit/core/model/chunk_schedule.h).")
      .def(py::init<int64_t, int64_t, bool>(), py::arg("batch"), py::arg("limit"),
           py::arg("can_split") = true)
      .def_property_readonly("done", &ChunkSchedule::done, "every sample has run")
      .def("next", &ChunkSchedule::next, "The chunk to run now.")
      .def("succeeded", &ChunkSchedule::succeeded, "It completed: move past it.")
      .def("failed", &ChunkSchedule::failed,
           "It ran out of memory: True when it is redone smaller, False when the "
           "schedule cannot go on.")
      .def_property_readonly("position", &ChunkSchedule::position, "the first sample not yet run")
      .def_property_readonly("size", &ChunkSchedule::size, "the chunk size the next chunk runs at")
      .def_property_readonly("ooms_recovered", &ChunkSchedule::ooms_recovered,
                             "chunks that ran out of memory and were redone smaller");
  py::class_<ChunkCoverage>(m, "ChunkCoverage",
                            "Which gradients (by index) a chunk still owes its samples to "
                            "(see include/memfit/core/model/chunk_coverage.h).")
      .def(py::init<size_t>(), py::arg("items"))
      .def("owed", &ChunkCoverage::owed, py::arg("chunk"))
      .def("add", &ChunkCoverage::add, py::arg("chunk"), py::arg("items"));

  py::class_<StepReport>(m, "StepReport")
      .def_readonly("batch", &StepReport::batch, "the whole batch")
      .def_readonly("micro_batch", &StepReport::micro_batch, "the largest micro-batch that ran")
      .def_readonly("micro_batches", &StepReport::micro_batches,
                    "micro-batches that ran to completion")
      .def_readonly("ooms_recovered", &StepReport::ooms_recovered,
                    "out-of-memory errors recovered from by halving")
      .def_readonly("samples", &StepReport::samples, "samples whose gradient was accumulated")
      .def_readwrite("loss", &StepReport::loss, "the whole batch's loss (mean or sum)")
      .def_readonly("peak_bytes", &StepReport::peak_bytes,
                    "the most tracked bytes live on the CPU at once")
      .def_readonly("chunks", &StepReport::chunks, "micro-batch sizes in the order they completed")
      .def_readwrite("notes", &StepReport::notes,
                     "what the step did differently from the whole batch in one step")
      .def("__repr__", [](const StepReport& r) {
        std::string s = "StepReport(batch=" + std::to_string(r.batch) + ", micro_batch=" +
                        std::to_string(r.micro_batch) + ", micro_batches=" +
                        std::to_string(r.micro_batches) + ", ooms_recovered=" +
                        std::to_string(r.ooms_recovered) + ", loss=" + std::to_string(r.loss) +
                        ", peak_bytes=" + std::to_string(r.peak_bytes);
        // What differs from one eager step (dropout's masks) is said where printed.
        if (!r.notes.empty()) {
          s += ", notes=[";
          for (size_t i = 0; i < r.notes.size(); ++i) {
            s += (i ? ", " : "") + py::repr(py::str(r.notes[i])).cast<std::string>();
          }
          s += "]";
        }
        return s + ")";
      });

  py::class_<TrainerOptions>(m, "TrainerOptions",
                             "How a Trainer runs its steps (include/memfit/torch/trainer.h).")
      .def(py::init([](std::optional<int64_t> budget, bool split, const std::string& coupled,
                       bool mean_loss, int64_t micro_batch, bool autocast_bf16) {
             TrainerOptions o;
             o.budget = budget;
             o.split = split;
             o.coupled = coupled_layers_from(coupled);
             o.mean_loss = mean_loss;
             o.micro_batch = micro_batch;
             o.autocast_bf16 = autocast_bf16;
             return o;
           }),
           py::kw_only(), py::arg("budget") = py::none(), py::arg("split") = true,
           py::arg("coupled") = "error", py::arg("mean_loss") = true,
           py::arg("micro_batch") = 0, py::arg("autocast_bf16") = false)
      .def_readwrite("budget", &TrainerOptions::budget,
                     "the simulated device's budget for the step in bytes; None: none")
      .def_readwrite("split", &TrainerOptions::split,
                     "False: run the batch whole and let an OOM out")
      .def_property(
          "coupled", [](const TrainerOptions& o) { return to_string(o.coupled); },
          [](TrainerOptions& o, const std::string& c) { o.coupled = coupled_layers_from(c); },
          "error or allow: what a split does to batch-coupled layers (BatchNorm in training)")
      .def_readwrite("mean_loss", &TrainerOptions::mean_loss,
                     "the loss is a mean over samples (False: a sum)")
      .def_readwrite("micro_batch", &TrainerOptions::micro_batch,
                     "the first micro-batch to try; 0: the whole batch")
      .def_readwrite("autocast_bf16", &TrainerOptions::autocast_bf16,
                     "forward and loss under CPU autocast in bfloat16");

  py::class_<Trainer>(m, "Trainer")
      .def(py::init([](std::vector<at::Tensor> params, py::function optimizer_step,
                       const TrainerOptions& options, std::vector<std::string> coupled_layers) {
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
                 options, std::move(coupled_layers));
           }),
           py::arg("params"), py::arg("optimizer_step"), py::kw_only(), py::arg("options"),
           py::arg("coupled_layers") = std::vector<std::string>{},
           "A Trainer over `params`, stepped by optimizer_step(); coupled_layers: the "
           "names of the batch-coupled layers.")
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
      .def_property_readonly("budget", &Trainer::budget, "the budget in bytes, or None")
      .def_property_readonly("micro_batch", &Trainer::micro_batch,
                             "the micro-batch the next step starts from (0: the whole batch)")
      .def("set_micro_batch", &Trainer::set_micro_batch, py::arg("micro_batch"),
           "Start the next step from this many samples (0: the whole batch).");

  py::class_<OomMemory>(m, "OomMemory",
                        "Bytes live on the device when it ran out, by what holds them "
                        "(core/model/oom_cause.h).")
      .def(py::init([](int64_t parameters, int64_t gradients, int64_t optimizer_state,
                       int64_t batch, int64_t activations, int64_t temporaries, int64_t other) {
             return OomMemory{parameters, gradients, optimizer_state, batch, activations,
                              temporaries, other};
           }),
           py::kw_only(), py::arg("parameters") = 0, py::arg("gradients") = 0,
           py::arg("optimizer_state") = 0, py::arg("batch") = 0, py::arg("activations") = 0,
           py::arg("temporaries") = 0, py::arg("other") = 0)
      .def_readwrite("parameters", &OomMemory::parameters, "the model's trainable weights")
      .def_readwrite("gradients", &OomMemory::gradients, "their gradients")
      .def_readwrite("optimizer_state", &OomMemory::optimizer_state, "the optimizer's state")
      .def_readwrite("batch", &OomMemory::batch, "the batch's own inputs and targets")
      .def_readwrite("activations", &OomMemory::activations,
                     "saved by the forward for the backward")
      .def_readwrite("temporaries", &OomMemory::temporaries, "what an op holds while it runs")
      .def_readwrite("other", &OomMemory::other, "anything else the loop holds");
  py::class_<OomExplanation>(m, "OomExplanation", "An out-of-memory error explained.")
      .def_property_readonly(
          "cause", [](const OomExplanation& e) { return to_string(e.diagnosis.cause); },
          "model, optimizer_state, batch, activations, temporaries or other: what the "
          "advice answers")
      .def_readonly("message", &OomExplanation::message,
                    "the message a front raises: CUDA's words, where it ran out, what fills "
                    "the memory, the advice")
      .def_property_readonly(
          "advice", [](const OomExplanation& e) { return e.diagnosis.advice; },
          "one or two sentences for the cause")
      .def_property_readonly(
          "what_fills", [](const OomExplanation& e) { return e.diagnosis.what_fills; },
          "the nonzero parts of the memory, largest first")
      .def_property_readonly(
          "phase", [](const OomExplanation& e) { return to_string(e.phase); },
          "where in the step it ran out, in words");
  m.def(
      "explain_oom",
      [](const std::string& operation, const std::string& what, const std::string& phase,
         const OomMemory& memory, std::optional<int64_t> budget, bool state_on_host,
         const std::string& detail, bool training) {
        return explain_oom(operation, what, oom_phase_of(phase), memory, budget, state_on_host,
                           detail, training);
      },
      py::arg("operation"), py::arg("what"), py::arg("phase"), py::arg("memory"),
      py::kw_only(), py::arg("budget") = py::none(), py::arg("state_on_host") = false,
      py::arg("detail") = "", py::arg("training") = true,
      "An OOM explained (an OomExplanation): what fills the memory and the advice that "
      "fits it. phase: a profile phase name. training=False: grad disabled (an "
      "evaluation), no gradient to come beside the parameters.");
  m.def("allocator_figures", &allocator_figures, py::arg("message"),
        "An allocator's OOM message without CUDA's words and its generic advice.");
}

}  // namespace memfit::python
