# Note [Unity builds]
# A unity (jumbo) build compiles a target's .cpp files in batches, each batch
# one translation unit that #includes its files, so the headers they share
# are parsed, and the inline functions they share compiled, once per batch
# instead of once per file. That pays where headers dominate: memfit_torch's
# and the CLI library's units parse torch's C++ API (10-20 s of CPU each
# before any memfit code), the extension's parse pybind11 (and two of them
# torch's Python headers). memfit_core includes no torch header, but its 45
# units each parse the standard library's: its 45 files as one unit took 35
# CPU s (load 4), against about 74 s as 45 units (idle), so it is batched too.
#
# On for pip's builds (MEMFIT_WHEEL), which are always cold: no ccache, no
# precompiled header (Note [Precompiled torch headers]). A cold `pip wheel`,
# both ways in one run (bench/install_time.py --variant
# nounity=-Ccmake.define.MEMFIT_UNITY_BUILD=OFF, 2026-11-29, load 2-8 from
# other jobs): 553 CPU s with batches of 4, 699 without (0.79x).
# On for make's build where it is cold (scripts/cold_build.sh: ccache not
# installed, or its cache empty: a new machine, CI), with the C++ tests of
# memfit_torch batched too. Measured whole, a cold build of everything
# `make test` runs (CCACHE_DISABLE=1 /usr/bin/time cmake --build DIR -j2 in
# fresh folders configured as the Makefile does, at a60b4ec, 2026-11-29):
#   per file, precompiled headers (the old cold default): 480 s wall,
#     646 CPU s (load 2.3-4.7);
#   batches of 4, precompiled headers: 417 s wall, 405 CPU s (load
#     3.7-6.9; an earlier run at load 5-8: 652 s, 458 CPU s);
#   batches of 4, no precompiled headers: 215 s wall, 414 CPU s (load
#     2.3-4.7). memfit_torch's four batches took 102 s of jobs there
#     against 401 s per file with its header (78 s of that the header).
#     With these objects ctest passed whole (367 tests, cli.* and
#     consumer.* apart) and so did the consumer project. Other jobs shared
#     the machine, differently in each run: CPU seconds compare them best.
# Off where it is warm: there one edited file would recompile its whole
# batch (a minute, not 15 s), and ccache would keep a batch only until any
# of its four files changes. A folder configured cold stays batched until
# `make clean`; UNITY=ON|OFF (make) or -DMEMFIT_UNITY_BUILD decides.
#
# A batch is one translation unit: names in anonymous namespaces, `using`
# declarations and macros of one file are seen by the files after it, so two
# files of these targets must not define the same internal name (memfit_core's
# 45 files compile as one unit without error: every batching of them is safe;
# so do memfit_torch_tests' 8). memfit_core_tests is not batched: 11 of its
# files define the same file-local helper (fake, Fake, MiB, kMiB, Step,
# training_step); renamed apart in a scratch copy, its 33 files in 9
# batches took 46 CPU s against 69 per file, 37 s wall against 36 (its
# target alone, -j2, load 3, at 2f3c7e8): not worth 100 renamed lines.
# Batches of 4 give memfit_torch 4 units and the extension 5, so both cores
# stay busy within a target; larger ones parse less but leave a core idle at
# the end.
set(MEMFIT_UNITY_DEFAULT OFF)
if(MEMFIT_WHEEL)
  set(MEMFIT_UNITY_DEFAULT ON)
endif()
option(MEMFIT_UNITY_BUILD "Compile the core, torch, binding and torch test targets in batches (Note [Unity builds])"
       ${MEMFIT_UNITY_DEFAULT})
set(MEMFIT_UNITY_BATCH 4 CACHE STRING "Files per unity batch (Note [Unity builds])")
set(MEMFIT_UNITY_TARGETS memfit_core memfit_torch memfit_cli_lib _memfit memfit_torch_tests CACHE STRING
    "The targets MEMFIT_UNITY_BUILD batches (Note [Unity builds])")

if(MEMFIT_UNITY_BUILD)
  foreach(target ${MEMFIT_UNITY_TARGETS})
    if(TARGET ${target})
      set_target_properties(${target} PROPERTIES UNITY_BUILD ON
                            UNITY_BUILD_BATCH_SIZE ${MEMFIT_UNITY_BATCH})
    endif()
  endforeach()
  message(STATUS "memfit: unity build of ${MEMFIT_UNITY_TARGETS}, ${MEMFIT_UNITY_BATCH} files a batch (MEMFIT_UNITY_BUILD)")
endif()
