// Note [Meta kernels live in torch's Python]
// torch 2.x registers many of its meta kernels (relu, index_select,
// convolution backward, ...) from its Python package, when `import torch`
// runs torch/_meta_registrations.py. A C++-only process lacks them: memfit
// fills those the built-in models run (Note [Native meta kernels],
// src/torch/native_meta.cpp) and falls back to cpu for any other. The
// `memfit` command pip installs runs inside Python, with torch's Python
// kernels; these tests do as it does: start an interpreter, import torch from
// the build's venv, then run.
#include <gtest/gtest.h>
#include <pybind11/embed.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  pybind11::scoped_interpreter python;
  pybind11::module_::import("sys").attr("path").attr("insert")(0, MEMFIT_TEST_SITE_PACKAGES);
  pybind11::module_::import("torch");
  // torch's autograd engine refuses to run while the GIL is held; Python
  // meta kernels take it back as they need it.
  pybind11::gil_scoped_release no_gil;
  return RUN_ALL_TESTS();
}
