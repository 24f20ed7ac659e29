#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

namespace memfit::python {

// For __repr__: a string as Python writes it, and a list of numbers.
inline std::string quoted(const std::string& s) { return pybind11::repr(pybind11::str(s)); }
template <typename T>
std::string listed(const std::vector<T>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

void init_errors(pybind11::module_& m);
void init_units(pybind11::module_& m);
void init_progress(pybind11::module_& m);
void init_timeline(pybind11::module_& m);
void init_tracking(pybind11::module_& m);
void init_report(pybind11::module_& m);
void init_step_protocol(pybind11::module_& m);  // after init_progress
void init_data_parallel(pybind11::module_& m);  // after init_report
void init_trainer(pybind11::module_& m);
void init_fit(pybind11::module_& m);
void init_ddp_budget(pybind11::module_& m);  // after init_fit (DoesNotFit)
void init_strategies(pybind11::module_& m);
void init_cli(pybind11::module_& m);
void init_native_meta(pybind11::module_& m);
void init_explain(pybind11::module_& m);  // after init_report (Report)
void init_flop_count(pybind11::module_& m);

}  // namespace memfit::python
