# Note [Precompiled torch headers]
# Nearly every translation unit of memfit_torch, memfit_cli_lib and the
# extension parses torch's C++ API headers (torch/torch.h directly, or
# torch/nn/module.h and torch/optim/optimizer.h through memfit's headers):
# 10-20 s of CPU each on this machine before any memfit code compiles. A cold
# `pip install` parses them once per target instead: one precompiled
# torch/torch.h shared by memfit_torch and memfit_cli_lib, one with pybind11
# for the extension. The price: the header's own build (~50 s, before that
# target's other units start), and a few seconds to load it (it is ~700 MB)
# in each unit, which a light unit would not have paid
# (bench/install_time.py measures both ways).
#
# ON by default for pip's builds (MEMFIT_WHEEL); a development build (make)
# has ccache, which GCC's precompiled headers would defeat (every object a
# miss) and which serves a warm rebuild faster than any header, so make asks
# for them only where ccache has nothing to give: not installed, or its cache
# empty (a new machine, CI; scripts/pch_default.sh). There they cut a cold
# make build's CPU time (docs/benchmarks.md, "Building memfit").
# (option() takes ON/OFF, not scikit-build-core's SKBUILD=2.)
if(MEMFIT_WHEEL)
  set(MEMFIT_PCH_DEFAULT ON)
else()
  set(MEMFIT_PCH_DEFAULT OFF)
endif()
option(MEMFIT_PRECOMPILE_HEADERS "Precompile torch's headers (Note [Precompiled torch headers])"
       ${MEMFIT_PCH_DEFAULT})

if(MEMFIT_PRECOMPILE_HEADERS AND TARGET memfit_torch)
  target_precompile_headers(memfit_torch PRIVATE <torch/torch.h>)
  if(TARGET memfit_cli_lib)
    target_precompile_headers(memfit_cli_lib REUSE_FROM memfit_torch)
  endif()
  # make's build (Makefile, scripts/pch_default.sh): the C++ tests of
  # memfit_torch, a third of a cold make build's compiling without it. Their
  # own header: an executable is built -fPIE, and GCC refuses a header
  # precompiled -fPIC (-Winvalid-pch says so) and parses torch again.
  if(TARGET memfit_torch_tests)
    target_precompile_headers(memfit_torch_tests PRIVATE <torch/torch.h> <gtest/gtest.h>)
  endif()
  if(TARGET _memfit)
    target_precompile_headers(_memfit PRIVATE <pybind11/pybind11.h> <pybind11/stl.h>
                              <pybind11/functional.h> <torch/torch.h>)
  endif()
  message(STATUS "memfit: precompiled torch headers (MEMFIT_PRECOMPILE_HEADERS)")
endif()
