#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "memfit/core/model/event.h"
#include "memfit/core/model/timeline.h"
#include "memfit/core/render/stacked_plot.h"

namespace py = pybind11;

namespace memfit::python {
namespace {

py::dict breakdown_dict(const Timeline::Breakdown& b) {
  py::dict categories;
  for (int c = 0; c < kNumCategories; ++c) {
    categories[py::str(std::string(to_string(static_cast<Category>(c))))] =
        b.by_category[c];
  }
  py::dict out;
  out["total"] = b.total;
  out["categories"] = categories;
  out["phases"] = b.by_phase;
  out["modules"] = b.by_module;
  return out;
}

}  // namespace

void init_timeline(py::module_& m) {
  py::class_<Timeline::Peak>(m, "Peak")
      .def_readonly("bytes", &Timeline::Peak::bytes, "the highest live bytes")
      .def_readonly("event_index", &Timeline::Peak::event_index,
                    "the event after which it was first reached")
      .def_readonly("time_ns", &Timeline::Peak::time_ns, "that event's time, in nanoseconds")
      .def("__repr__", [](const Timeline::Peak& p) {
        return "Peak(bytes=" + std::to_string(p.bytes) + ", event_index=" +
               std::to_string(p.event_index) + ")";
      });

  py::class_<Timeline::PhaseSummary>(m, "PhaseSummary")
      .def_readonly("name", &Timeline::PhaseSummary::name, "the phase")
      .def_readonly("iteration", &Timeline::PhaseSummary::iteration, "its iteration")
      .def_readonly("live_before", &Timeline::PhaseSummary::live_before,
                    "live bytes when the span began")
      .def_readonly("live_after", &Timeline::PhaseSummary::live_after, "live bytes when it ended")
      .def_readonly("delta", &Timeline::PhaseSummary::delta, "live_after - live_before")
      .def_readonly("peak", &Timeline::PhaseSummary::peak, "the most live bytes during the span")
      .def("__repr__", [](const Timeline::PhaseSummary& p) {
        return "PhaseSummary(" + quoted(p.name) + ", iteration=" + std::to_string(p.iteration) +
               ", live_after=" + std::to_string(p.live_after) +
               ", peak=" + std::to_string(p.peak) + ")";
      });

  py::class_<Timeline>(m, "Timeline")
      .def("__len__", &Timeline::size)
      .def("__repr__", [](const Timeline& t) {
        return "Timeline(" + std::to_string(t.size()) + " events, peak_bytes=" +
               std::to_string(t.size() ? t.peak().bytes : 0) +
               ", live_bytes=" + std::to_string(t.live_bytes()) + ")";
      })
      .def_property_readonly("live_bytes", &Timeline::live_bytes, "live bytes after the last event")
      .def("peak", &Timeline::peak)
      .def("peak_phase", [](const Timeline& t) {
        return t.phase_name(t.peak().phase);
      })
      .def("peak_op", [](const Timeline& t) { return t.op_name(t.peak().op); })
      .def("peak_module", [](const Timeline& t) {
        return t.module_name(t.peak().module);
      })
      .def("live_after", &Timeline::live_after, py::arg("event_index"))
      .def("breakdown_after", [](const Timeline& t, size_t i) {
        return breakdown_dict(t.breakdown_after(i));
      }, py::arg("event_index"))
      .def("breakdown_at_peak", [](const Timeline& t) {
        return breakdown_dict(t.breakdown_after(t.peak().event_index));
      })
      .def("phase_summaries", &Timeline::phase_summaries)
      .def("phase_spans", [](const Timeline& t) {
        py::list out;
        for (const PhaseSpan& s : t.phase_spans()) {
          out.append(py::make_tuple(t.phase_name(s.phase), s.iteration, s.first_event,
                                    s.end_event));
        }
        return out;
      }, "(phase, iteration, first event, end event) per phase span, in order.")
      .def("curve", [](const Timeline& t, size_t max_points) {
        return max_points ? t.curve(max_points) : t.curve();
      }, py::arg("max_points") = 0)
      .def("events", [](const Timeline& t) {
        // (kind, bytes, id, device, category, phase, module, op) per event.
        py::list out;
        for (const Event& e : t.events()) {
          out.append(py::make_tuple(
              e.kind == EventKind::kAlloc ? "alloc" : "free", e.bytes, e.id,
              std::string(to_string(e.device)),
              std::string(to_string(e.category)),
              t.phase_name(e.phase), t.module_name(e.module), t.op_name(e.op)));
        }
        return out;
      })
      .def("svg", [](const Timeline& t, const std::string& title,
                     const std::string& x_axis, int width, int height) {
        StackedPlotOptions o;
        o.title = title;
        o.x_axis = plot_axis_from_string(x_axis);
        o.width = width;
        o.height = height;
        return stacked_plot(t, o).svg();
      }, py::arg("title") = "memfit", py::arg("x_axis") = "time",
         py::arg("width") = 1200, py::arg("height") = 500,
         "Memory by category over time as an SVG document: the categories "
         "stacked, the phases labelled, the peak annotated with its top "
         "categories and modules. x_axis: 'time' (wall time; event order "
         "when no times were recorded) or 'events'.");
}

}  // namespace memfit::python
