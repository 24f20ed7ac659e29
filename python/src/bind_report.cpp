#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <utility>

#include "bindings.h"
#include "memfit/core/model/peak_model.h"
#include "memfit/core/model/report.h"
#include "memfit/core/render/html_report.h"
#include "memfit/core/render/report_text.h"
#include "memfit/core/render/stacked_plot.h"

namespace py = pybind11;

namespace memfit::python {

void init_report(py::module_& m) {
  py::class_<PhaseRow> phase_row(m, "PhaseRow");
  for_each_phase_row_field(
      [&](const char* key, auto field, const char* doc) {
        phase_row.def_readonly(key, field, doc);
      });
  phase_row
      .def("as_dict", [](const PhaseRow& r) {
        py::dict d;
        for_each_phase_row_field(
            [&](const char* key, auto field, const char*) { d[key] = r.*field; });
        return d;
      }, "The fields as a dict, keyed as the report's JSON.")
      .def("__repr__", [](const PhaseRow& r) {
        return "PhaseRow(" + quoted(r.name) + ", iteration=" + std::to_string(r.iteration) +
               ", live_bytes_after=" + std::to_string(r.live_after) +
               ", peak_bytes=" + std::to_string(r.peak_bytes) + ")";
      });

  py::class_<CudaEstimate>(m, "CudaEstimate")
      .def_readonly("peak_allocated", &CudaEstimate::peak_allocated,
          "the peak of requests rounded as the caching allocator rounds them, workspace included")
      .def_readonly("peak_reserved", &CudaEstimate::peak_reserved,
                    "the peak of segments the caching allocator holds from the device")
      .def_readonly("workspace_bytes", &CudaEstimate::workspace_bytes,
                    "the fixed per-device workspace counted in both");
  py::class_<Report>(m, "Report")
      .def_readonly("model", &Report::model, "the model's name")
      .def_readonly("batch", &Report::batch, "the batch the step ran at")
      .def_readonly("optimizer", &Report::optimizer,
                    "adam, sgd, momentum, none or the optimizer's class name")
      .def_readonly("mode", &Report::mode, "cpu or meta: the mode used, after any fallback")
      .def_readonly("peak_bytes", &Report::peak_bytes, "the step's peak of live tracked bytes")
      .def_readonly("peak_phase", &Report::peak_phase, "the phase the peak is reached in")
      .def_readonly("peak_iteration", &Report::peak_iteration, "the iteration of that phase")
      .def_readonly("peak_op", &Report::peak_op,
                    "the op running when the peak was reached; '' when none")
      .def_readonly("parameter_bytes", &Report::parameter_bytes,
                    "the parameters' and buffers' bytes on the device")
      .def_readonly("phases", &Report::phases, "one PhaseRow per phase, in order, both iterations")
      .def("__repr__", [](const Report& r) {
        return "Report(" + quoted(r.model) + ", batch=" + std::to_string(r.batch) +
               ", mode=" + quoted(r.mode) + ", peak_bytes=" + std::to_string(r.peak_bytes) +
               ", peak_phase=" + quoted(r.peak_phase) + ")";
      })
      .def_property_readonly("categories_at_peak", [](const Report& r) {
        py::dict d;
        for (int c = 0; c < kNumCategories; ++c) {
          d[py::str(std::string(to_string(static_cast<Category>(c))))] =
              r.categories_at_peak[c];
        }
        return d;
      }, "bytes by category at the peak, as a dict")
      .def_property_readonly("modules", [](const Report& r) {
        py::list l;
        for (const auto& mrow : r.modules) {
          l.append(py::make_tuple(mrow.path, mrow.activation_bytes));
        }
        return l;
      }, "(path, activation bytes saved for backward) per module, largest first")
      .def_readwrite("truth", &Report::truth,
                     "where the figures were measured, in words (\"\" says nothing)")
      .def_readwrite("notes", &Report::notes,
                     "what the figures rest on (a fallback, host bytes), one line each")
      .def_readonly("cuda", &Report::cuda,
                    "the CudaEstimate when a CUDA target was asked for, else None")
      .def("table", [](const Report& r, size_t max_modules) { return to_text(r, max_modules); },
           py::arg("max_modules") = 10, "The table `memfit profile` prints (render/report_text.h).")
      .def("to_json", [](const Report& r, bool pretty) { return to_json(r, pretty); },
           py::arg("pretty") = true, "The JSON `memfit profile --json` prints.")
      .def("set_cuda_estimate", [](Report& r, const Timeline& t, int64_t workspace) {
        r.cuda = estimate_cuda(t, workspace);
      }, py::arg("timeline"), py::arg("workspace_bytes") = kDefaultCudaWorkspaceBytes)
      .def("set_card_figures", [](Report& r, int64_t peak_allocated, int64_t peak_reserved) {
        r.cuda = CudaEstimate{peak_allocated, peak_reserved, 0};
      }, py::arg("peak_allocated"), py::arg("peak_reserved"),
         "The figures a card's own caching allocator counted (mode='device' on a card), "
         "in place of an estimate")
      .def("budget_peak", &Report::budget_peak);
  m.attr("DEFAULT_CUDA_WORKSPACE") = kDefaultCudaWorkspaceBytes;

  m.def("make_report", [](const Timeline& t, const std::string& model,
                          int64_t batch, const std::string& optimizer,
                          const std::string& mode) {
    return make_report(t, ReportInputs{model, batch, optimizer, mode});
  }, py::arg("timeline"), py::arg("model"), py::arg("batch"),
     py::arg("optimizer"), py::arg("mode"));

  py::class_<PeakModel>(m, "PeakModel")
      .def_readonly("mode", &PeakModel::mode, "the mode the probes ran in")
      .def_readonly("probe_batches", &PeakModel::probe_batches, "the batches the probes ran at")
      .def_readonly("probe_peaks", &PeakModel::probe_peaks, "the peak measured at each probe")
      .def_readonly("notes", &PeakModel::notes, "what the fit found, one line each")
      .def("predict", &PeakModel::predict, py::arg("batch"))
      .def("__repr__", [](const PeakModel& pm) {
        return "PeakModel(mode=" + quoted(pm.mode) + ", probe_batches=" +
               listed(pm.probe_batches) + ", probe_peaks=" + listed(pm.probe_peaks) + ")";
      })
      .def("peak_phase", [](const PeakModel& pm, int64_t b) {
        const PhaseFit& f = pm.peak_phase(b);
        return py::make_tuple(f.phase, f.iteration);
      }, py::arg("batch"))
      .def("max_rel_residual", &PeakModel::max_rel_residual)
      .def("max_batch_under", &PeakModel::max_batch_under, py::arg("budget"));

  py::class_<AdviceRow>(m, "AdviceRow")
      .def(py::init([](std::string name, int64_t peak_bytes, int64_t saving_bytes,
                       double time_ratio, std::optional<bool> fits, std::string result) {
             return AdviceRow{std::move(name), peak_bytes, saving_bytes, time_ratio, fits,
                              std::move(result)};
           }),
           py::arg("name"), py::arg("peak_bytes"), py::arg("saving_bytes"),
           py::arg("time_ratio"), py::arg("fits"), py::arg("result"))
      .def_readonly("name", &AdviceRow::name, "the strategy, as the advise table names it")
      .def_readonly("peak_bytes", &AdviceRow::peak_bytes, "its peak at the whole batch")
      .def_readonly("saving_bytes", &AdviceRow::saving_bytes, "the plain step's peak less this one")
      .def_readonly("time_ratio", &AdviceRow::time_ratio, "its step time over the plain step's")
      .def_readonly("fits", &AdviceRow::fits,
                    "its peak is within the budget; None without a budget")
      .def_readonly("result", &AdviceRow::result, "same, changes or no training")
      .def_readonly("predicted", &AdviceRow::predicted,
                    "its peak is predicted from the recorded rows, not recorded")
      .def("__repr__", [](const AdviceRow& r) {
        return "AdviceRow(" + quoted(r.name) + ", peak_bytes=" + std::to_string(r.peak_bytes) +
               ")";
      });

  py::class_<AdviceTable>(m, "AdviceTable")
      .def(py::init([](int64_t budget_bytes, int64_t plain_peak_bytes,
                       std::vector<AdviceRow> rows, std::string plan,
                       std::vector<std::string> notes) {
             return AdviceTable{budget_bytes, plain_peak_bytes, std::move(rows),
                                std::move(plan), std::move(notes)};
           }),
           py::arg("budget_bytes"), py::arg("plain_peak_bytes"), py::arg("rows"),
           py::arg("plan"), py::arg("notes"))
      .def_readonly("budget_bytes", &AdviceTable::budget_bytes, "the budget; 0 for none")
      .def_readonly("plain_peak_bytes", &AdviceTable::plain_peak_bytes, "the plain step's peak")
      .def_readonly("rows", &AdviceTable::rows, "one AdviceRow per strategy")
      .def_readonly("plan", &AdviceTable::plan, "one line: what the plan runs, or why none fits")
      .def_readonly("notes", &AdviceTable::notes, "the advice's notes, one line each")
      .def("__repr__", [](const AdviceTable& a) {
        return "AdviceTable(" + std::to_string(a.rows.size()) + " rows, plan=" +
               quoted(a.plan) + ")";
      });

  m.def("advice_table", &advice_table, py::arg("advice"),
        "What the HTML page shows of an Advice (memfit.advise's native result): each "
        "row's peak, saving, time, fits and result, and the plan in one line; the same "
        "mapping `memfit profile --html --advise` uses (render/advice_table.h).");

  m.def("html_report", [](const Report& r, const Timeline& t, const std::string& title,
                          const std::string& x_axis, int64_t budget,
                          const PeakModel* prediction, const AdviceTable* advice) {
    HtmlReportOptions o;
    o.title = title;
    o.x_axis = plot_axis_from_string(x_axis);
    o.budget = budget;
    if (prediction) o.prediction = *prediction;
    if (advice) o.advice = *advice;
    return html_report(r, t, o);
  }, py::arg("report"), py::arg("timeline"), py::arg("title") = "",
     py::arg("x_axis") = "time", py::arg("budget") = 0,
     py::arg("prediction") = nullptr, py::arg("advice") = nullptr,
     "One self-contained HTML page of the report: the stacked timeline and the "
     "module bars (hover for exact bytes), the tables, the notes, the peak over "
     "batch sizes (prediction, with the budget line when budget > 0) and the "
     "advise table (advice). No network, no external scripts.");

  m.def("fit_peak_model", [](const std::vector<int64_t>& batches,
                             const std::vector<Report>& reports,
                             const std::vector<const Timeline*>& timelines) {
    return fit_peak_model(batches, reports, timelines);
  }, py::arg("batches"), py::arg("reports"), py::arg("timelines"));
}

}  // namespace memfit::python
