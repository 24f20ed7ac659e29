// One rank's peak under data parallelism, bound beside the Report it sits
// on (Note [One rank's memory under data parallelism]).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "bindings.h"
#include "memfit/core/model/data_parallel.h"
#include "memfit/core/model/report.h"

namespace py = pybind11;

namespace memfit::python {

// After init_report: adds to its Report class.
void init_data_parallel(py::module_& m) {
  py::class_<RankPeak>(m, "RankPeak")
      .def_property_readonly("sharding",
                             [](const RankPeak& r) { return std::string(to_string(r.sharding)); },
                             "ddp, zero1, zero2, zero3 or fsdp2: how the rank holds "
                             "parameters, gradients and state")
      .def_readonly("peak_bytes", &RankPeak::peak_bytes, "this rank's peak on the device, in bytes")
      .def_readonly("phase", &RankPeak::phase,
          "the phase the peak is reached in (ddp_construction: DDP's broadcast and buckets)")
      .def_readonly("iteration", &RankPeak::iteration, "the iteration of that phase")
      .def_readonly("formula", &RankPeak::formula, "the rule applied, in words")
      .def_readonly("host_bytes", &RankPeak::host_bytes,
          "FSDP2 with CPU offload: the most bytes the host holds for this rank; 0 otherwise")
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
      .def("add_fsdp2", [](Report& r, const Timeline& t, const Fsdp2Setup& d) {
        // After set_data_parallel: one more row, replacing an earlier fsdp2.
        if (!r.data_parallel) {
          throw std::logic_error("[add_fsdp2] call set_data_parallel first");
        }
        auto& rows = r.data_parallel->per_rank;
        rows.erase(std::remove_if(rows.begin(), rows.end(),
                                  [](const RankPeak& p) { return p.sharding == Sharding::kFsdp2; }),
                   rows.end());
        rows.push_back(fsdp2_rank_peak(t, d));
        return rows.back();
      }, py::arg("timeline"), py::arg("setup"))
      .def_property_readonly("data_parallel", [](const Report& r) -> py::object {
        if (!r.data_parallel) return py::none();
        return py::cast(r.data_parallel->per_rank);
      }, "one RankPeak per sharding when set_data_parallel ran, else None");

  py::class_<Fsdp2Unit>(m, "Fsdp2Unit")
      .def(py::init([](std::string path, int64_t param_bytes, int64_t shard_bytes,
                       int64_t gathered_bytes, int64_t reduce_bytes,
                       int64_t gather_input_bytes, int64_t grad_cast_bytes) {
             return Fsdp2Unit{std::move(path), param_bytes, shard_bytes, gathered_bytes,
                              reduce_bytes, gather_input_bytes, grad_cast_bytes};
           }), py::arg("path"), py::arg("param_bytes"), py::arg("shard_bytes"),
           py::arg("gathered_bytes"), py::arg("reduce_bytes"),
           py::arg("gather_input_bytes") = 0, py::arg("grad_cast_bytes") = 0)
      .def_readonly("path", &Fsdp2Unit::path,
          "the module's path; '' for the root, gathered from its forward to the end of backward")
      .def_readonly("param_bytes", &Fsdp2Unit::param_bytes,
                    "bytes of the unit's parameters as the single process holds them")
      .def_readonly("shard_bytes", &Fsdp2Unit::shard_bytes,
          "this rank's shard: each parameter's dim 0 padded to a multiple of W, 1/W of it")
      .def_readonly("gathered_bytes", &Fsdp2Unit::gathered_bytes,
                    "the all-gathered parameters: W x the padded shard, in param_dtype if any")
      .def_readonly("reduce_bytes", &Fsdp2Unit::reduce_bytes,
                    "the reduce-scatter input: W x the padded shard in the reduce dtype")
      .def_readonly("gather_input_bytes", &Fsdp2Unit::gather_input_bytes,
                    "the copy of the shard cast to param_dtype before its all-gather; 0 without")
      .def_readonly("grad_cast_bytes", &Fsdp2Unit::grad_cast_bytes,
                    "the unsharded gradients cast to the reduce dtype; 0 without")
      .def("__repr__", [](const Fsdp2Unit& u) {
        return "Fsdp2Unit('" + u.path + "', param_bytes=" + std::to_string(u.param_bytes) +
               ", shard_bytes=" + std::to_string(u.shard_bytes) + ")";
      });
  py::class_<Fsdp2Setup>(m, "Fsdp2Setup")
      .def(py::init([](int world_size, std::vector<Fsdp2Unit> units, double grad_scale,
                       bool cpu_offload) {
             return Fsdp2Setup{world_size, std::move(units), grad_scale, cpu_offload};
           }), py::arg("world_size"), py::arg("units"), py::arg("grad_scale") = 1.0,
           py::arg("cpu_offload") = false)
      .def_readonly("world_size", &Fsdp2Setup::world_size, "the ranks fully_shard shards over")
      .def_readonly("units", &Fsdp2Setup::units,
                    "the root unit first (if it has parameters), then the others in forward order")
      .def_readonly("grad_scale", &Fsdp2Setup::grad_scale,
          "unsharded gradient bytes per byte the single process recorded (0.5: bf16 over fp32)")
      .def_readonly("cpu_offload", &Fsdp2Setup::cpu_offload,
          "CPUOffloadPolicy: sharded parameters, gradients and optimizer state on the host");
  py::class_<ParamShape>(m, "ParamShape")
      .def(py::init([](int64_t rows, int64_t numel, int element_size, bool cast_to_param_dtype) {
             return ParamShape{rows, numel, element_size, cast_to_param_dtype};
           }), py::arg("rows"), py::arg("numel"), py::arg("element_size"),
           py::arg("cast_to_param_dtype") = false)
      .def_readonly("rows", &ParamShape::rows, "dim 0's size (1 for a 0-dim parameter)")
      .def_readonly("numel", &ParamShape::numel, "the parameter's elements")
      .def_readonly("element_size", &ParamShape::element_size,
                    "bytes per element of the parameter's dtype")
      .def_readonly("cast_to_param_dtype", &ParamShape::cast_to_param_dtype,
                    "its dtype differs from param_dtype: the shard is cast before its all-gather");
  m.def("fsdp2_unit", [](std::string path, const std::vector<ParamShape>& params,
                         int world_size, int param_dtype_size, int reduce_dtype_size,
                         bool cpu_offload) {
        return fsdp2_unit(std::move(path), params, world_size,
                          Fsdp2Precision{param_dtype_size, reduce_dtype_size}, cpu_offload);
      }, py::arg("path"), py::arg("params"), py::arg("world_size"),
      py::arg("param_dtype_size") = 0, py::arg("reduce_dtype_size") = 0,
      py::arg("cpu_offload") = false,
      "One fully_shard unit's sizes; dtype sizes 0 for none (see fsdp2_unit in "
      "memfit/core/model/data_parallel.h).");
  m.def("fsdp2_grad_scale", [](const std::vector<ParamShape>& params, int param_dtype_size) {
        return fsdp2_grad_scale(params, Fsdp2Precision{param_dtype_size, 0});
      }, py::arg("params"), py::arg("param_dtype_size") = 0,
      "Fsdp2Setup.grad_scale: the param dtype's size over the widest parameter's, at most 1.");
  m.def("fsdp2_rank_peak", &fsdp2_rank_peak, py::arg("timeline"), py::arg("setup"),
        "See Note [One rank's memory under FSDP2].");

  m.def("largest_partition_fraction", &largest_partition_fraction,
        py::arg("param_bytes"), py::arg("world_size"), py::arg("per_parameter_bytes") = 0);
  m.def("step_reorder_bytes", &step_reorder_bytes, py::arg("param_bytes"),
        py::arg("world_size"),
        "See Note [A rank's optimizer step deals parameters in another order].");
}

}  // namespace memfit::python
