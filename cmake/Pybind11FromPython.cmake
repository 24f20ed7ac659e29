# pybind11 from the Python that builds memfit (pip's pybind11 has a CMake
# config but no place on CMake's search path); a pybind11_DIR given wins.
find_package(Python COMPONENTS Interpreter Development.Module REQUIRED)
set(PYBIND11_FINDPYTHON ON)
if(NOT pybind11_DIR)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c "import pybind11; print(pybind11.get_cmake_dir(), end='')"
    OUTPUT_VARIABLE pybind11_DIR ERROR_QUIET)
endif()
find_package(pybind11 CONFIG REQUIRED)
