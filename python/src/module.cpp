// The _memfit extension: one init_<part> per core or torch header, glue only.
#include <pybind11/pybind11.h>

#include "bindings.h"

PYBIND11_MODULE(_memfit, m) {
  m.doc() = "memfit's C++ core; use the `memfit` package, not this module.";
  memfit::python::init_errors(m);
  memfit::python::init_units(m);
  memfit::python::init_progress(m);
  memfit::python::init_timeline(m);
  memfit::python::init_tracking(m);
  memfit::python::init_report(m);
  memfit::python::init_step_protocol(m);
  memfit::python::init_data_parallel(m);
  memfit::python::init_trainer(m);
  memfit::python::init_fit(m);
  memfit::python::init_ddp_budget(m);
  memfit::python::init_strategies(m);
  memfit::python::init_cli(m);
  memfit::python::init_native_meta(m);
  memfit::python::init_explain(m);
  memfit::python::init_flop_count(m);
}
