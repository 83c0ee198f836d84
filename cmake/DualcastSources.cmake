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
