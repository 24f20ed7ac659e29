# Note [Precompiled torch headers]
# Most translation units of memfit_torch, memfit_cli_lib and the C++ tests
# parse torch's C++ API headers (torch/torch.h directly, or torch/nn/module.h
# and torch/optim/optimizer.h through memfit's headers): 10-20 s of CPU each
# on this machine before any memfit code compiles. A precompiled torch/torch.h
# parses them once per target instead. The price: the header's own build
# (~50 s, before that target's other units start), and a few seconds to load
# it (it is ~700 MB) in each unit, which a light unit would not have paid.
# The extension's binding units mostly include memfit's light headers only,
# so it gets none (bench/install_time.py measures both ways).
#
# Off for pip's builds (MEMFIT_WHEEL): measured whole (bench/install_time.py
# --variant no-pch=..., the same run, 2026-11-29), a cold `pip wheel` took
# 614 CPU s with the headers and 512 without (0.83x): half the extension's
# units never include torch, yet each loads the ~700 MB header, and each
# header's own build holds its target's units back. A development build
# (make) has ccache, which GCC's precompiled headers would defeat (every
# object a miss) and which serves a warm rebuild faster than any header, so
# make asks for them only where ccache has nothing to give: not installed,
# or its cache empty (a new machine, CI; scripts/pch_default.sh), where the
# C++ tests' heavy units share one (docs/benchmarks.md, "Building memfit").
# (option() takes ON/OFF, not scikit-build-core's SKBUILD=2.)
set(MEMFIT_PCH_DEFAULT OFF)
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
  message(STATUS "memfit: precompiled torch headers (MEMFIT_PRECOMPILE_HEADERS)")
endif()
