#pragma once

#include <pybind11/pybind11.h>

namespace memfit::python {

void init_errors(pybind11::module_& m);
void init_units(pybind11::module_& m);
void init_timeline(pybind11::module_& m);
void init_tracking(pybind11::module_& m);
void init_report(pybind11::module_& m);
void init_trainer(pybind11::module_& m);
void init_strategies(pybind11::module_& m);
void init_cli(pybind11::module_& m);

}  // namespace memfit::python
