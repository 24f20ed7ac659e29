#include <pybind11/pybind11.h>

#include "bindings.h"
#include "memfit/core/plan/ddp_budget.h"

namespace py = pybind11;

namespace memfit::python {

void init_ddp_budget(py::module_& m) {
  m.def(
      "budget_beside_ddp_buckets", &budget_beside_ddp_buckets,
      py::arg("budget"), py::arg("bucket_bytes"), py::arg("op"),
      py::arg("shard_hint"),
      "What a DDP rank's step may use of `budget`; raises DoesNotFit when the "
      "buckets alone take it.");
}

}  // namespace memfit::python
