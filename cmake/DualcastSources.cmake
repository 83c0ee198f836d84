# DualcastSources.cmake: one source tree, two backends. A .cu file is compiled by nvcc when the CUDA
# backend is on and as ordinary C++ otherwise, so CPU-only builds test the very same code.
function(dualcast_kernel_sources)
  if(NOT DUALCAST_WITH_CUDA)
    set_source_files_properties(${ARGN} PROPERTIES LANGUAGE CXX COMPILE_OPTIONS "-xc++")
  endif()
endfunction()

# dualcast_executable(name sources...): an executable of .cu/.cpp files linked to dualcast.
function(dualcast_executable name)
  add_executable(${name} ${ARGN})
  set(cu ${ARGN})
  list(FILTER cu INCLUDE REGEX "\\.cu$")
  dualcast_kernel_sources(${cu})
  target_link_libraries(${name} PRIVATE dualcast::dualcast)
endfunction()

# dualcast_data_parallel_driver(target source): `source` includes experiments/common/distributed.hpp
# (--gpus N), which re-executes the driver through scripts/launch. Only that file gets the path: a
# definition that names the checkout makes objects differ between clones (cmake/DualcastCcache.cmake).
function(dualcast_data_parallel_driver name source)
  set_property(SOURCE ${source} APPEND PROPERTY COMPILE_DEFINITIONS
               DUALCAST_LAUNCHER="${PROJECT_SOURCE_DIR}/scripts/launch")
endfunction()

# dualcast_find_plot_python(var): sets var to the first python3 that can import matplotlib (the one
# CMake finds, then /usr/bin/python3: Debian's python3-matplotlib serves the system interpreter, which
# need not be the python3 first on PATH), or to "" when none can. The plot scripts' tests use it.
function(dualcast_find_plot_python var)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  set(found "")
  foreach(py ${Python3_EXECUTABLE} /usr/bin/python3)
    if(NOT found AND EXISTS ${py})
      execute_process(COMMAND ${py} -c "import matplotlib" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
      if(rc EQUAL 0)
        set(found ${py})
      endif()
    endif()
  endforeach()
  set(${var} "${found}" PARENT_SCOPE)
endfunction()
