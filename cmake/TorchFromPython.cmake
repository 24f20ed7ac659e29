# Finds LibTorch the way a pip user has it: inside the torch package of the
# Python that builds memfit (torch.utils.cmake_prefix_path), so the C++ build
# and the Python extension link the very torch that `import torch` loads.
# A Torch_DIR or CMAKE_PREFIX_PATH given by hand still wins.
#
# CUDA wheels: torch's CMake config insists on a CUDA toolkit (cudart and
# nvrtc) even for code that never compiles a kernel. A machine with the
# wheel but no full toolkit fails there ("Your installed Caffe2 version uses
# CUDA but I cannot find the CUDA libraries"); set CUDA_TOOLKIT_ROOT_DIR and
# CUDA_nvrtc_LIBRARY (the wheel ships libnvrtc under nvidia/) in that case.

find_package(Python COMPONENTS Interpreter REQUIRED)

if(NOT Torch_DIR)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
            "import torch; print(torch.utils.cmake_prefix_path, end='')"
    OUTPUT_VARIABLE MEMFIT_TORCH_PREFIX
    RESULT_VARIABLE MEMFIT_TORCH_FOUND
    ERROR_QUIET)
  if(NOT MEMFIT_TORCH_FOUND EQUAL 0)
    message(FATAL_ERROR
      "memfit: ${Python_EXECUTABLE} cannot import torch. Install torch>=2.4 "
      "into that Python (make test does: .venv with requirements.txt), or "
      "pass -DPython_EXECUTABLE=/path/to/python-with-torch")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${MEMFIT_TORCH_PREFIX}")
endif()

find_package(Torch REQUIRED)
if(Torch_VERSION VERSION_LESS 2.4)
  message(FATAL_ERROR "memfit needs torch >= 2.4; found ${Torch_VERSION} in ${Torch_DIR}")
endif()
message(STATUS "memfit: torch ${Torch_VERSION} from ${Torch_DIR}")

# torch 2.14's headers refuse C++17 ("C++20 or later compatible compiler is
# required to use ATen"); memfit_core stays C++17, what includes torch is
# compiled as the headers demand.
if(Torch_VERSION VERSION_GREATER_EQUAL 2.14)
  set(MEMFIT_TORCH_CXX_FEATURE cxx_std_20)
else()
  set(MEMFIT_TORCH_CXX_FEATURE cxx_std_17)
endif()
