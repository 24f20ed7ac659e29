#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <iostream>

#include "bindings.h"
#include "memfit/cli/run.h"

namespace py = pybind11;

namespace memfit::python {

void init_cli(py::module_& m) {
  m.def(
      "run_cli",
      [](std::vector<std::string> args) {
        // Python's buffered output first, then ours: the lines stay in order.
        py::module_::import("sys").attr("stdout").attr("flush")();
        int status = 0;
        {
          // torch's autograd engine refuses to start while the GIL is held;
          // Python meta kernels take it back as they need it.
          py::gil_scoped_release no_gil;
          status = cli::run(std::move(args));
        }
        std::cout.flush();
        std::cerr.flush();
        return status;
      },
      py::arg("args"),
      "Runs `memfit ARGS...` in this process (torch's Python meta kernels "
      "loaded); returns the exit status: 0 done, 1 bad input, 2 out of memory.");
}

}  // namespace memfit::python
