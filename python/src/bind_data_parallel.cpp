// One rank's peak under data parallelism, bound beside the Report it sits
// on (Note [One rank's memory under data parallelism]).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "memfit/core/data_parallel.h"
#include "memfit/core/report.h"

namespace py = pybind11;

namespace memfit::python {

// After init_report: adds to its Report class.
void init_data_parallel(py::module_& m) {
  py::class_<RankPeak>(m, "RankPeak")
      .def_property_readonly("sharding",
                             [](const RankPeak& r) { return std::string(to_string(r.sharding)); })
      .def_readonly("peak_bytes", &RankPeak::peak_bytes)
      .def_readonly("phase", &RankPeak::phase)
      .def_readonly("iteration", &RankPeak::iteration)
      .def_readonly("formula", &RankPeak::formula)
      .def("__repr__", [](const RankPeak& r) {
        return "RankPeak(" + std::string(to_string(r.sharding)) + ", peak_bytes=" +
               std::to_string(r.peak_bytes) + ", phase=" + r.phase + ")";
      });

  auto report = py::reinterpret_borrow<py::class_<Report>>(m.attr("Report"));
  report.def("set_data_parallel", [](Report& r, const Timeline& t, int world_size,
                                   int64_t gradient_bytes, bool gradient_as_bucket_view,
                                   int64_t bucket_cap_bytes, int64_t largest_unit_bytes,
                                   double optimizer_shard_fraction, int64_t step_reorder_bytes) {
        DataParallelSetup d;
        d.world_size = world_size;
        d.gradient_bytes = gradient_bytes;
        d.gradient_as_bucket_view = gradient_as_bucket_view;
        d.bucket_cap_bytes = bucket_cap_bytes;
        d.largest_unit_bytes = largest_unit_bytes;
        d.optimizer_shard_fraction = optimizer_shard_fraction;
        d.step_reorder_bytes = step_reorder_bytes;
        r.data_parallel = DataParallelEstimate{d, per_rank_peaks(t, d)};
      }, py::arg("timeline"), py::arg("world_size"), py::arg("gradient_bytes"),
         py::arg("gradient_as_bucket_view"), py::arg("bucket_cap_bytes"),
         py::arg("largest_unit_bytes"), py::arg("optimizer_shard_fraction"),
         py::arg("step_reorder_bytes") = 0)
      .def_property_readonly("data_parallel", [](const Report& r) -> py::object {
        if (!r.data_parallel) return py::none();
        return py::cast(r.data_parallel->per_rank);
      });

  m.def("largest_partition_fraction", &largest_partition_fraction,
        py::arg("param_bytes"), py::arg("world_size"));
  m.def("step_reorder_bytes", &step_reorder_bytes, py::arg("param_bytes"),
        py::arg("world_size"),
        "See Note [A rank's optimizer step deals parameters in another order].");
}

}  // namespace memfit::python
