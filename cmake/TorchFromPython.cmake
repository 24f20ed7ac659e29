# Note [Torch from Python]
# memfit needs torch's headers and libc10, libtorch_cpu and libtorch (the
# extension also libtorch_python): what torch.utils.cpp_extension gives any
# CPU extension. torch's own CMake config (find_package(Torch)) goes through
# Caffe2's CUDA discovery whenever the wheel is a CUDA build, and fails on a
# machine with the wheel and a driver but no toolkit ("Your installed Caffe2
# version uses CUDA but I cannot find the CUDA libraries"), although memfit
# compiles no CUDA code. So by default memfit asks the Python that builds it
# (torch_flags.py beside this file) and makes imported targets from the
# answer: the very torch that `import torch` loads there, with its include
# folders, its libraries, its C++11-ABI flag and the C++ standard its headers
# demand. A Torch_DIR or Torch_ROOT, or a CMAKE_PREFIX_PATH entry that holds a
# TorchConfig.cmake (a libtorch zip), given by hand still wins: then
# find_package(Torch), as before.
#
# Either way the result is one target, MemfitTorch::libtorch, which
# memfit_torch links. memfitConfig.cmake includes this file again, so a C++
# user's project recreates it rather than inheriting paths of the machine
# that built memfit.
#
#   memfit_find_torch([PYTHON exe])
# sets, in the caller's scope: TORCH_LIBRARIES (MemfitTorch::libtorch, what
# memfit_torch links), MEMFIT_TORCH_VERSION, MEMFIT_TORCH_FROM (python or cmake), MEMFIT_TORCH_CXX_FEATURE (cxx_std_17 or cxx_std_20) and
# MEMFIT_TORCH_CUDA (the wheel's CUDA version, empty for a CPU build),
# MEMFIT_TORCH_CXX11_ABI (torch's _GLIBCXX_USE_CXX11_ABI, 0 or 1; empty when
# a hand-given torch's flags do not say); makes
# MemfitTorch::libtorch and, where torch has it, MemfitTorch::torch_python.
include_guard(GLOBAL)
set(MEMFIT_TORCH_FLAGS_PY ${CMAKE_CURRENT_LIST_DIR}/torch_flags.py)

# A hand-given torch: Torch_DIR / Torch_ROOT, or a prefix entry holding a
# torch config directly (torch.utils.cmake_prefix_path, libtorch/, a CMake
# install prefix). scikit-build-core puts site-packages itself on
# CMAKE_PREFIX_PATH; that holds torch/share/cmake/Torch, one level deeper than
# these, and does not count.
function(_memfit_torch_by_hand out)
  set(prefixes ${CMAKE_PREFIX_PATH})
  if(NOT "$ENV{CMAKE_PREFIX_PATH}" STREQUAL "")
    string(REPLACE ":" ";" env_prefixes "$ENV{CMAKE_PREFIX_PATH}")
    list(APPEND prefixes ${env_prefixes})
  endif()
  set(hand OFF)
  if(Torch_DIR OR Torch_ROOT OR NOT "$ENV{Torch_DIR}$ENV{Torch_ROOT}" STREQUAL "")
    set(hand ON)
  endif()
  foreach(p IN LISTS prefixes)
    foreach(sub . Torch share/cmake/Torch lib/cmake/Torch)
      if(EXISTS "${p}/${sub}/TorchConfig.cmake")
        set(hand ON)
      endif()
    endforeach()
  endforeach()
  set(${out} ${hand} PARENT_SCOPE)
endfunction()

# 17 or 20: what ATen/ATen.h's `#if __cplusplus < 2020xxL #error` asks
# (torch 2.14's headers refuse C++17; memfit_core stays C++17).
function(_memfit_torch_cxx_feature includes out)
  set(std 17)
  foreach(dir IN LISTS includes)
    if(EXISTS "${dir}/ATen/ATen.h")
      file(STRINGS "${dir}/ATen/ATen.h" guard REGEX "__cplusplus < [0-9]+L" LIMIT_COUNT 1)
      if(guard MATCHES "__cplusplus < 20([0-9][0-9])[0-9][0-9]L" AND CMAKE_MATCH_1 GREATER 17)
        set(std ${CMAKE_MATCH_1})
      endif()
      break()
    endif()
  endforeach()
  set(${out} cxx_std_${std} PARENT_SCOPE)
endfunction()

function(_memfit_torch_from_cmake)
  find_package(Torch REQUIRED)
  add_library(MemfitTorch::libtorch INTERFACE IMPORTED)
  set_property(TARGET MemfitTorch::libtorch PROPERTY INTERFACE_LINK_LIBRARIES ${TORCH_LIBRARIES})
  find_library(MEMFIT_TORCH_PYTHON_LIBRARY torch_python HINTS "${TORCH_INSTALL_PREFIX}/lib")
  if(MEMFIT_TORCH_PYTHON_LIBRARY)
    add_library(MemfitTorch::torch_python SHARED IMPORTED)
    set_target_properties(MemfitTorch::torch_python PROPERTIES
      IMPORTED_LOCATION "${MEMFIT_TORCH_PYTHON_LIBRARY}"
      INTERFACE_LINK_LIBRARIES "${TORCH_LIBRARIES}")
  endif()
  _memfit_torch_cxx_feature("${TORCH_INCLUDE_DIRS}" feature)
  set(abi "")
  if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=([01])")
    set(abi ${CMAKE_MATCH_1})
  endif()
  set(MEMFIT_TORCH_CXX11_ABI "${abi}" PARENT_SCOPE)
  set(MEMFIT_TORCH_VERSION ${Torch_VERSION} PARENT_SCOPE)
  set(MEMFIT_TORCH_CXX_FEATURE ${feature} PARENT_SCOPE)
  set(MEMFIT_TORCH_CUDA "" PARENT_SCOPE)
  set(MEMFIT_TORCH_WHERE ${Torch_DIR} PARENT_SCOPE)
endfunction()

function(_memfit_torch_from_python python)
  set(flags ${CMAKE_BINARY_DIR}/memfit_torch_flags.cmake)
  execute_process(COMMAND "${python}" "${MEMFIT_TORCH_FLAGS_PY}" "${flags}"
                  RESULT_VARIABLE rc ERROR_VARIABLE why OUTPUT_QUIET)
  if(NOT rc EQUAL 0)
    string(STRIP "${why}" why)
    message(FATAL_ERROR "memfit: ${python} cannot give torch's build flags (${why}): "
      "install torch>=2.4 into that Python, or pass -DPython_EXECUTABLE=/path/to/python-with-torch")
  endif()
  include(${flags})
  foreach(lib c10 torch_cpu torch torch_python)
    add_library(MemfitTorch::${lib} SHARED IMPORTED)
    set_target_properties(MemfitTorch::${lib} PROPERTIES
      IMPORTED_LOCATION "${MEMFIT_TORCH_LIB_${lib}}")
  endforeach()
  set_property(TARGET MemfitTorch::torch_cpu PROPERTY INTERFACE_LINK_LIBRARIES MemfitTorch::c10)
  set_property(TARGET MemfitTorch::torch PROPERTY INTERFACE_LINK_LIBRARIES MemfitTorch::torch_cpu)
  set_property(TARGET MemfitTorch::torch_python PROPERTY INTERFACE_LINK_LIBRARIES MemfitTorch::torch)
  _memfit_torch_cxx_feature("${MEMFIT_TORCH_INCLUDES}" feature)
  add_library(MemfitTorch::libtorch INTERFACE IMPORTED)
  set_target_properties(MemfitTorch::libtorch PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${MEMFIT_TORCH_INCLUDES}"
    INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=${MEMFIT_TORCH_CXX11_ABI}"
    INTERFACE_COMPILE_FEATURES ${feature}
    INTERFACE_LINK_LIBRARIES MemfitTorch::torch)
  set(MEMFIT_TORCH_VERSION ${MEMFIT_TORCH_VERSION} PARENT_SCOPE)
  set(MEMFIT_TORCH_CXX_FEATURE ${feature} PARENT_SCOPE)
  set(MEMFIT_TORCH_CXX11_ABI ${MEMFIT_TORCH_CXX11_ABI} PARENT_SCOPE)
  set(MEMFIT_TORCH_CUDA "${MEMFIT_TORCH_CUDA}" PARENT_SCOPE)
  set(MEMFIT_TORCH_WHERE "${MEMFIT_TORCH_ROOT} (${python})" PARENT_SCOPE)
endfunction()

function(memfit_find_torch)
  cmake_parse_arguments(arg "" PYTHON "" ${ARGN})
  if(TARGET MemfitTorch::libtorch)
    set(TORCH_LIBRARIES MemfitTorch::libtorch PARENT_SCOPE)
    return()
  endif()
  _memfit_torch_by_hand(hand)
  if(hand)
    _memfit_torch_from_cmake()
    set(from cmake)
  else()
    set(python ${arg_PYTHON})
    if(NOT python)
      if(NOT Python_EXECUTABLE)
        find_package(Python COMPONENTS Interpreter REQUIRED)
      endif()
      set(python ${Python_EXECUTABLE})
    endif()
    _memfit_torch_from_python("${python}")
    set(from python)
  endif()
  if(MEMFIT_TORCH_VERSION VERSION_LESS 2.4)
    message(FATAL_ERROR "memfit needs torch >= 2.4; found ${MEMFIT_TORCH_VERSION} in ${MEMFIT_TORCH_WHERE}")
  endif()
  if(MEMFIT_TORCH_CUDA)
    set(cuda " (a CUDA ${MEMFIT_TORCH_CUDA} build; memfit compiles no CUDA code and needs no toolkit)")
  endif()
  message(STATUS "memfit: torch ${MEMFIT_TORCH_VERSION}${cuda} from ${MEMFIT_TORCH_WHERE}, ${MEMFIT_TORCH_CXX_FEATURE}")
  foreach(v VERSION CXX_FEATURE CUDA CXX11_ABI)
    set(MEMFIT_TORCH_${v} "${MEMFIT_TORCH_${v}}" PARENT_SCOPE)
  endforeach()
  set(MEMFIT_TORCH_FROM ${from} PARENT_SCOPE)
  set(TORCH_LIBRARIES MemfitTorch::libtorch PARENT_SCOPE)
endfunction()
