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
# header's own build holds its target's units back.
# Off for make's build too, unless PCH=ON: where ccache holds objects, GCC's
# precompiled headers would defeat it (every object a miss), and a cold build
# (scripts/cold_build.sh) compiles in unity batches instead (Note [Unity
# builds]), where a batch parses torch once anyway. Both ways, whole and
# cold (CCACHE_DISABLE=1 /usr/bin/time cmake --build DIR -j2, at a60b4ec,
# 2026-11-29): batches with the headers 405 CPU s (417 s wall, load 3.7-6.9),
# batches alone 414 CPU s (215 s wall, load 2.3-4.7): the same CPU, and
# each of the two headers (torch's, the tests') is a 78-100 s job that
# holds its target's batches back; per file with the headers (the old
# cold default) 646 CPU s, 480 s wall (load 2.3-4.7).
# (option() takes ON/OFF, not scikit-build-core's SKBUILD=2.)
set(MEMFIT_PCH_DEFAULT OFF)
option(MEMFIT_PRECOMPILE_HEADERS "Precompile torch's headers (Note [Precompiled torch headers])"
       ${MEMFIT_PCH_DEFAULT})

if(MEMFIT_PRECOMPILE_HEADERS AND TARGET memfit_torch)
  target_precompile_headers(memfit_torch PRIVATE <torch/torch.h>)
  if(TARGET memfit_cli_lib)
    target_precompile_headers(memfit_cli_lib REUSE_FROM memfit_torch)
  endif()
  # The C++ tests of memfit_torch when they compile per file (8 units, each
  # parsing torch). Their own header: an executable is built -fPIE, and GCC
  # refuses a header precompiled -fPIC (-Winvalid-pch says so). Not when
  # batched (Note [Unity builds]): there the header (a 78-100 s job) cost
  # more than the two batches it serves (60 s of jobs without it).
  if(TARGET memfit_torch_tests)
    get_target_property(memfit_tests_batched memfit_torch_tests UNITY_BUILD)
    if(NOT memfit_tests_batched)
      target_precompile_headers(memfit_torch_tests PRIVATE <torch/torch.h> <gtest/gtest.h>)
    endif()
  endif()
  message(STATUS "memfit: precompiled torch headers (MEMFIT_PRECOMPILE_HEADERS)")
endif()
