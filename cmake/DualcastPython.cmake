# DualcastPython.cmake: dualcast._core, the pybind11 extension module of the Python package
# (python/dualcast/csrc/core.cpp), built into ${CMAKE_BINARY_DIR}/python/dualcast/ where the tests
# (DUALCAST_CORE_DIR) and setup.py find it.
#
# DUALCAST_PYTHON: AUTO (built when Python3's Development.Module and pybind11 are found), ON (an
# error when they are not), OFF. pybind11 is looked for in this order, and the configure output says
# which was taken or why the module is not built:
#   1. its CMake config (a system package such as Debian's pybind11-dev);
#   2. the pybind11 Python package of the chosen Python (pybind11.get_cmake_dir());
#   3. the headers PyTorch bundles (torch/include/pybind11), which a GPU machine with PyTorch has
#      even without any pybind11 package.
# Python3_EXECUTABLE picks the Python (setup.py passes the installing one): the module only loads
# in a Python of the same ABI (its file name carries the tag, e.g. cpython-311-x86_64-linux-gnu).
set(DUALCAST_PYTHON AUTO CACHE STRING "Build the Python module dualcast._core: AUTO, ON or OFF")
set_property(CACHE DUALCAST_PYTHON PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${DUALCAST_PYTHON}" _dc_py_mode)
if(NOT _dc_py_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "DUALCAST_PYTHON must be AUTO, ON or OFF, not '${DUALCAST_PYTHON}'")
endif()

set(DUALCAST_PYTHON_MODULE_DIR ${CMAKE_BINARY_DIR}/python/dualcast)
set(DUALCAST_PYTHON_BUILT OFF)
set(_dc_py_why "")
set(_dc_pybind11 "")
if(_dc_py_mode STREQUAL "OFF")
  set(_dc_py_why "DUALCAST_PYTHON=OFF")
else()
  find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
  if(NOT Python3_Development.Module_FOUND)
    string(CONCAT _dc_py_why "no Python 3 with its C headers (Development.Module) was found (interpreter: "
                  "'${Python3_EXECUTABLE}'; install python3-dev, or pass -DPython3_EXECUTABLE=...)")
  else()
    find_package(pybind11 CONFIG QUIET)
    if(pybind11_FOUND)
      set(_dc_pybind11 "pybind11 ${pybind11_VERSION} (CMake config in ${pybind11_DIR})")
      set(_dc_pybind11_target pybind11::headers)
    else()
      execute_process(COMMAND ${Python3_EXECUTABLE} -c "import pybind11; print(pybind11.get_cmake_dir())"
                      OUTPUT_VARIABLE _dc_dir OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _dc_rc ERROR_QUIET)
      if(_dc_rc EQUAL 0 AND _dc_dir)
        find_package(pybind11 CONFIG QUIET PATHS ${_dc_dir} NO_DEFAULT_PATH)
      endif()
      if(pybind11_FOUND)
        set(_dc_pybind11 "pybind11 ${pybind11_VERSION} (the Python package of ${Python3_EXECUTABLE}: ${pybind11_DIR})")
        set(_dc_pybind11_target pybind11::headers)
      else()
        # PyTorch's bundled headers: asked of the chosen Python, since each PyTorch carries its own.
        execute_process(COMMAND ${Python3_EXECUTABLE} -c
                          "import torch.utils.cpp_extension as c; print(';'.join(c.include_paths()))"
                        OUTPUT_VARIABLE _dc_torch_inc OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _dc_rc ERROR_QUIET)
        if(_dc_rc EQUAL 0 AND _dc_torch_inc)
          find_path(DUALCAST_PYBIND11_INCLUDE pybind11/pybind11.h PATHS ${_dc_torch_inc} NO_DEFAULT_PATH)
        endif()
        if(DUALCAST_PYBIND11_INCLUDE)
          set(_dc_pybind11 "pybind11 headers bundled with PyTorch (${DUALCAST_PYBIND11_INCLUDE})")
          add_library(dualcast_pybind11_headers INTERFACE)
          target_include_directories(dualcast_pybind11_headers SYSTEM INTERFACE ${DUALCAST_PYBIND11_INCLUDE})
          set(_dc_pybind11_target dualcast_pybind11_headers)
        else()
          string(CONCAT _dc_py_why "pybind11 not found: no pybind11 CMake config, no pybind11 Python package and "
                        "no PyTorch with bundled headers in ${Python3_EXECUTABLE} (install pybind11-dev or "
                        "`pip install pybind11`)")
        endif()
      endif()
    endif()
  endif()
endif()

if(_dc_py_why)
  if(_dc_py_mode STREQUAL "ON")
    message(FATAL_ERROR "dualcast: DUALCAST_PYTHON=ON, but the Python module dualcast._core cannot be built: ${_dc_py_why}")
  endif()
  message(STATUS "dualcast: Python module dualcast._core not built: ${_dc_py_why}")
  return()
endif()

Python3_add_library(dualcast_core MODULE WITH_SOABI ${PROJECT_SOURCE_DIR}/python/dualcast/csrc/core.cpp)
target_link_libraries(dualcast_core PRIVATE dualcast ${_dc_pybind11_target})
# Hidden symbols, as pybind11 asks of every module (its types must not clash between modules).
set_target_properties(dualcast_core PROPERTIES
  OUTPUT_NAME _core
  LIBRARY_OUTPUT_DIRECTORY ${DUALCAST_PYTHON_MODULE_DIR}
  CXX_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON)
target_compile_options(dualcast_core PRIVATE -Wall -Wextra)
# The module exports its entry point and nothing else. Without this it exported some 700 symbols:
# template instantiations, libdualcast.a's, and GNU "unique" ones (function-local statics of inline
# code), which the dynamic loader binds process-wide whatever RTLD_LOCAL says. Where the compiler
# links libstdc++ statically (the GPU machine's /opt/gcc 13.3: the module needed no libstdc++.so),
# libstdc++'s own objects were among them, so a PyTorch imported afterwards could bind to the
# module's copies of another libstdc++ version: `import torch` after dualcast._core crashed there
# (paper/measured/h200-2026-11-29m). Hiding them keeps each library's C++ runtime its own.
if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
  set(_dc_core_map ${CMAKE_CURRENT_BINARY_DIR}/dualcast_core.map)
  file(WRITE ${_dc_core_map} "{ global: PyInit__core; local: *; };\n")
  target_link_options(dualcast_core PRIVATE "LINKER:--version-script=${_dc_core_map}" "LINKER:--exclude-libs,ALL")
  set_target_properties(dualcast_core PROPERTIES LINK_DEPENDS ${_dc_core_map})
endif()
set(DUALCAST_PYTHON_BUILT ON)
message(STATUS "dualcast: Python module dualcast._core for ${Python3_EXECUTABLE} (Python ${Python3_VERSION}, "
               "${Python3_SOABI}), with ${_dc_pybind11}, into ${DUALCAST_PYTHON_MODULE_DIR}")
