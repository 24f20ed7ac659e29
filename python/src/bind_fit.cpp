// Glue for batch_fit.h and batch_search.h: the search runs in C++ and calls
// back into Python to measure a step of the user's model.
#include <algorithm>
#include <stdexcept>

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "memfit/core/plan/batch_fit.h"
#include "memfit/core/plan/batch_search.h"
#include "memfit/core/plan/progress.h"
#include "memfit/core/render/fit_text.h"

namespace py = pybind11;

namespace memfit::python {
namespace {

// measure(batch) -> (Report, Timeline), or None when the step ran out of
// memory; the callback catches its own OOM.
MeasureStep from_python(py::function measure) {
  return [measure](int64_t batch) {
    StepMeasurement m;
    py::object got = measure(batch);
    if (got.is_none()) {
      m.out_of_memory = true;
    } else {
      auto pair = got.cast<std::pair<Report, Timeline>>();
      m.report = std::move(pair.first);
      m.timeline = std::move(pair.second);
    }
    return m;
  };
}

}  // namespace

void init_fit(py::module_& m) {
  py::register_exception<DoesNotFit>(m, "DoesNotFit", PyExc_ValueError);
  py::class_<ProbeRecord>(m, "ProbeRecord")
      .def_readonly("batch", &ProbeRecord::batch, "the batch the step ran at")
      .def_readonly("out_of_memory", &ProbeRecord::out_of_memory,
                    "the step raised an out-of-memory error")
      .def_readonly("peak_bytes", &ProbeRecord::peak_bytes,
                    "its measured peak (the budget peak on a CUDA target); 0 when out of memory")
      .def_readonly("predicted_bytes", &ProbeRecord::predicted_bytes,
                    "predicted by the probes before it; -1 when none was made")
      .def_readonly("verification", &ProbeRecord::verification,
                    "a full-size step at a candidate answer, not a probe")
      .def("__repr__", [](const ProbeRecord& p) {
        return "ProbeRecord(batch=" + std::to_string(p.batch) +
               ", peak_bytes=" + std::to_string(p.peak_bytes) +
               ", predicted_bytes=" + std::to_string(p.predicted_bytes) +
               ", out_of_memory=" + (p.out_of_memory ? "True" : "False") +
               ", verification=" + (p.verification ? "True" : "False") + ")";
      });
  py::class_<BatchFit>(m, "BatchFit")
      .def_readonly("max_batch", &BatchFit::max_batch,
                    "the largest batch whose whole step fits the budget")
      .def_readonly("recommended_batch", &BatchFit::recommended_batch,
          "the largest multiple of 8 at or below max_batch when it gives up at most an eighth")
      .def_readonly("predicted_peak_bytes", &BatchFit::predicted_peak_bytes,
                    "the peak model's prediction at max_batch")
      .def_readonly("budget_bytes", &BatchFit::budget_bytes, "the budget the batch was fitted to")
      .def_readonly("margin_bytes", &BatchFit::margin_bytes,
                    "kept free below the budget (the fit's residual and the margin asked for)")
      .def_readwrite("trials", &BatchFit::trials, "full-size steps run to verify the answer")
      .def_readonly("mode", &BatchFit::mode, "the mode the probes ran in: cpu or meta")
      .def_readonly("peak_phase", &BatchFit::peak_phase, "the phase holding the peak at max_batch")
      .def_readwrite("verified", &BatchFit::verified,
                     "a whole step ran at max_batch and stayed under budget - margin (False "
                     "too where that step could not stand for the user's data: the notes say)")
      .def_readonly("measured_peak_bytes", &BatchFit::measured_peak_bytes,
                    "the peak measured at max_batch; -1 when no step ran there")
      .def_readonly("probes", &BatchFit::probes,
                    "every step the search measured, in order (ProbeRecord)")
      .def_readonly("held_out_error", &BatchFit::held_out_error,
                    "the worst relative miss predicting a probe from the ones before it")
      .def_readonly("affine", &BatchFit::affine, "every probe was predicted within tolerance")
      .def_readwrite("notes", &BatchFit::notes,
                    "what the numbers rest on and what was left unverified, one line each")
      .def("to_json", [](const BatchFit& f, bool pretty) { return to_json(f, pretty); },
           py::arg("pretty") = true, "The JSON `memfit fit --json` prints (render/fit_text.h).")
      .def("__repr__", [](const BatchFit& f) {
        return "BatchFit(max_batch=" + std::to_string(f.max_batch) +
               ", recommended_batch=" + std::to_string(f.recommended_batch) +
               ", predicted_peak_bytes=" + std::to_string(f.predicted_peak_bytes) +
               ", budget_bytes=" + std::to_string(f.budget_bytes) +
               ", margin_bytes=" + std::to_string(f.margin_bytes) +
               ", trials=" + std::to_string(f.trials) + ", mode=" + quoted(f.mode) +
               ", verified=" + (f.verified ? "True" : "False") + ")";
      })
      .def("text", [](const BatchFit& f) { return to_text(f); },
           "The lines `memfit fit` prints.");

  py::class_<PredictionCertainty>(m, "PredictionCertainty")
      .def_readonly("batch", &PredictionCertainty::batch, "the batch predicted")
      .def_readonly("predicted_bytes", &PredictionCertainty::predicted_bytes,
                    "the peak predicted there")
      .def_readonly("probes", &PredictionCertainty::probes, "the batches the model was fitted on")
      .def_readonly("held_out_error", &PredictionCertainty::held_out_error,
                    "the worst relative miss predicting a probe from the ones before it")
      .def_readonly("beyond_probes", &PredictionCertainty::beyond_probes,
                    "the batch is above the largest probe: extrapolated")
      .def_readonly("affine", &PredictionCertainty::affine,
                    "every held-out check agreed within tolerance, and no allocation grew "
                    "faster than the batch between the two largest probes")
      .def_readonly("faster_than_batch", &PredictionCertainty::faster_than_batch,
                    "the largest allocation that grew faster than the batch, in words; "
                    "empty if none")
      .def_readonly("predicted_reserved_bytes", &PredictionCertainty::predicted_reserved_bytes,
                    "for a card: reserved bytes replayed on the step sized from the two "
                    "largest probes; -1 when not estimated")
      .def_readonly("notes", &PredictionCertainty::notes,
                    "what else may put the prediction off, one line each (text() says them)")
      .def("text", &PredictionCertainty::text)
      .def("__repr__", [](const PredictionCertainty& c) { return "<" + c.text() + ">"; });
  py::class_<ProbedModel>(m, "ProbedModel")
      .def_readonly("model", &ProbedModel::model,
                    "the PeakModel fitted on the largest probes that fit")
      .def_readonly("probes", &ProbedModel::probes,
                    "every probe, in the order measured (ProbeRecord)")
      .def_readonly("held_out_error", &ProbedModel::held_out_error,
                    "the worst relative miss predicting a probe from the ones before it")
      .def_readonly("affine", &ProbedModel::affine, "every held-out check agreed within tolerance")
      .def_readonly("notes", &ProbedModel::notes,
                    "what the probing found (a step not affine in the batch), one line each")
      .def("largest_probe", &ProbedModel::largest_probe)
      .def(
          "certainty_at",
          [](const ProbedModel& probed, int64_t batch, std::vector<std::string> notes) {
            PredictionCertainty c = certainty_at(probed, batch);
            c.notes = std::move(notes);
            return c;
          },
          py::arg("batch"), py::arg("notes") = std::vector<std::string>{},
          "How sure a prediction at `batch` is; `notes`: what else may put it off, one line "
          "each, said by text()");

  m.def("probe_memory_limit", &probe_memory_limit, py::arg("mode"),
        "Bytes one measured step in `mode` may take: unbounded on meta, else an "
        "eighth of this machine's RAM.");
  m.def(
      "probe_toward",
      [](py::function measure, int64_t target, std::vector<int64_t> first, int64_t limit) {
        ProbePlan plan;
        plan.limit_bytes = limit;
        if (!first.empty()) plan.first = std::move(first);
        return probe_toward_batch(from_python(std::move(measure)), target, plan);
      },
      py::arg("measure"), py::arg("target"), py::arg("first") = std::vector<int64_t>{},
      py::arg("limit") = INT64_MAX,
      "Probes grown toward `target`, none predicted past `limit` bytes: see Note [Probing toward the answer].");
  m.def(
      "search_batch",
      [](py::function measure, int64_t budget, int64_t margin, std::vector<int64_t> first,
         bool verify, int64_t host_limit, int64_t max_batch, py::object progress) {
        SearchOptions o;
        o.host_limit_bytes = host_limit;
        o.budget_bytes = budget;
        o.extra_margin_bytes = margin;
        if (!first.empty()) o.probes.first = std::move(first);
        o.verify = verify;
        o.max_batch = max_batch;
        // None: silent; else a callable given each line (the GIL is held,
        // as for measure).
        if (!progress.is_none()) {
          o.progress = Progress([progress](const std::string& line) { progress(line); });
        }
        return search_batch(from_python(std::move(measure)), o);
      },
      py::arg("measure"), py::arg("budget"), py::arg("margin") = 0,
      py::arg("first") = std::vector<int64_t>{}, py::arg("verify") = true,
      py::arg("host_limit") = INT64_MAX, py::arg("max_batch") = kMaxBatch,
      py::arg("progress") = py::none(),
      "The largest batch that fits, verified: see Note [Verifying the answer]. "
      "max_batch: no batch above it is wanted (a Trainer's whole batch): the search "
      "stops there.");
}

}  // namespace memfit::python
