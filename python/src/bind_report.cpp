#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <utility>

#include "bindings.h"
#include "memfit/core/html_report.h"
#include "memfit/core/peak_model.h"
#include "memfit/core/report.h"
#include "memfit/core/stacked_plot.h"

namespace py = pybind11;

namespace memfit::python {

void init_report(py::module_& m) {
  py::class_<PhaseRow> phase_row(m, "PhaseRow");
  for_each_phase_row_field(
      [&](const char* key, auto field) { phase_row.def_readonly(key, field); });
  phase_row
      .def("as_dict", [](const PhaseRow& r) {
        py::dict d;
        for_each_phase_row_field([&](const char* key, auto field) { d[key] = r.*field; });
        return d;
      }, "The fields as a dict, keyed as the report's JSON.")
      .def("__repr__", [](const PhaseRow& r) {
        return "PhaseRow(" + quoted(r.name) + ", iteration=" + std::to_string(r.iteration) +
               ", live_bytes_after=" + std::to_string(r.live_after) +
               ", peak_bytes=" + std::to_string(r.peak_bytes) + ")";
      });

  py::class_<CudaEstimate>(m, "CudaEstimate")
      .def_readonly("peak_allocated", &CudaEstimate::peak_allocated)
      .def_readonly("peak_reserved", &CudaEstimate::peak_reserved)
      .def_readonly("workspace_bytes", &CudaEstimate::workspace_bytes);
  py::class_<Report>(m, "Report")
      .def_readonly("model", &Report::model)
      .def_readonly("batch", &Report::batch)
      .def_readonly("optimizer", &Report::optimizer)
      .def_readonly("mode", &Report::mode)
      .def_readonly("peak_bytes", &Report::peak_bytes)
      .def_readonly("peak_phase", &Report::peak_phase)
      .def_readonly("peak_iteration", &Report::peak_iteration)
      .def_readonly("peak_op", &Report::peak_op)
      .def_readonly("parameter_bytes", &Report::parameter_bytes)
      .def_readonly("phases", &Report::phases)
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
      })
      .def_property_readonly("modules", [](const Report& r) {
        py::list l;
        for (const auto& mrow : r.modules) {
          l.append(py::make_tuple(mrow.path, mrow.activation_bytes));
        }
        return l;
      })
      .def_readwrite("notes", &Report::notes)
      .def_readonly("cuda", &Report::cuda)
      .def("table", &Report::table, py::arg("max_modules") = 10)
      .def("to_json", &Report::to_json, py::arg("pretty") = true)
      .def("set_cuda_estimate", [](Report& r, const Timeline& t, int64_t workspace) {
        r.cuda = estimate_cuda(t, workspace);
      }, py::arg("timeline"), py::arg("workspace_bytes") = kDefaultCudaWorkspaceBytes)
      .def("budget_peak", &Report::budget_peak);
  m.attr("DEFAULT_CUDA_WORKSPACE") = kDefaultCudaWorkspaceBytes;

  m.def("make_report", [](const Timeline& t, const std::string& model,
                          int64_t batch, const std::string& optimizer,
                          const std::string& mode) {
    return make_report(t, ReportInputs{model, batch, optimizer, mode});
  }, py::arg("timeline"), py::arg("model"), py::arg("batch"),
     py::arg("optimizer"), py::arg("mode"));

  py::class_<PeakModel>(m, "PeakModel")
      .def_readonly("mode", &PeakModel::mode)
      .def_readonly("probe_batches", &PeakModel::probe_batches)
      .def_readonly("probe_peaks", &PeakModel::probe_peaks)
      .def_readonly("notes", &PeakModel::notes)
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
      .def_readonly("name", &AdviceRow::name)
      .def_readonly("peak_bytes", &AdviceRow::peak_bytes)
      .def_readonly("saving_bytes", &AdviceRow::saving_bytes)
      .def_readonly("time_ratio", &AdviceRow::time_ratio)
      .def_readonly("fits", &AdviceRow::fits)
      .def_readonly("result", &AdviceRow::result)
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
      .def_readonly("budget_bytes", &AdviceTable::budget_bytes)
      .def_readonly("plain_peak_bytes", &AdviceTable::plain_peak_bytes)
      .def_readonly("rows", &AdviceTable::rows)
      .def_readonly("plan", &AdviceTable::plan)
      .def_readonly("notes", &AdviceTable::notes)
      .def("__repr__", [](const AdviceTable& a) {
        return "AdviceTable(" + std::to_string(a.rows.size()) + " rows, plan=" +
               quoted(a.plan) + ")";
      });

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
