# DualcastNccl.cmake: finds NCCL for data-parallel training on GPUs (include/dualcast/communicator.hpp),
# without a hand-set path. On the CPU machines it sits with the CUDA toolkit (<cuda>/include,
# <cuda>/lib); on the GPU machines it is a system package (/usr/include/nccl.h,
# /usr/lib/x86_64-linux-gnu/libnccl.so). NCCL_ROOT (cache or environment) is searched first. The
# result is said either way:
#   "dualcast: NCCL <version> at <library> (<include dir>)"
#   "dualcast: NCCL not found: data-parallel training runs on the CPU collective only"
# Sets DUALCAST_WITH_NCCL (ON/OFF), DUALCAST_NCCL_INCLUDE_DIR, DUALCAST_NCCL_LIBRARY.
option(DUALCAST_ENABLE_NCCL "Use NCCL for data-parallel training on CUDA devices when it is found" ON)
set(DUALCAST_WITH_NCCL OFF)
if(DUALCAST_WITH_CUDA AND DUALCAST_ENABLE_NCCL)
  set(_nccl_hints $ENV{NCCL_ROOT} ${NCCL_ROOT})
  set(_nccl_lib_hints ${CUDAToolkit_LIBRARY_DIR})
  if(CUDAToolkit_LIBRARY_ROOT)
    list(APPEND _nccl_lib_hints ${CUDAToolkit_LIBRARY_ROOT}/lib64 ${CUDAToolkit_LIBRARY_ROOT}/lib)
  endif()
  find_path(DUALCAST_NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include DOC "folder of nccl.h")
  find_library(DUALCAST_NCCL_LIBRARY nccl HINTS ${_nccl_hints} ${_nccl_lib_hints}
               PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu lib/aarch64-linux-gnu DOC "libnccl")
  if(DUALCAST_NCCL_INCLUDE_DIR AND DUALCAST_NCCL_LIBRARY)
    file(STRINGS ${DUALCAST_NCCL_INCLUDE_DIR}/nccl.h _nccl_lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
    set(_nccl_v "")
    foreach(part MAJOR MINOR PATCH)
      string(REGEX MATCH "NCCL_${part} +([0-9]+)" _m "${_nccl_lines}")
      list(APPEND _nccl_v ${CMAKE_MATCH_1})
    endforeach()
    list(JOIN _nccl_v "." DUALCAST_NCCL_VERSION)
    set(DUALCAST_WITH_NCCL ON)
    message(STATUS "dualcast: NCCL ${DUALCAST_NCCL_VERSION} at ${DUALCAST_NCCL_LIBRARY} (${DUALCAST_NCCL_INCLUDE_DIR})")
  else()
    message(STATUS "dualcast: NCCL not found: data-parallel training runs on the CPU collective only "
                   "(set NCCL_ROOT to point at an installation)")
  endif()
elseif(DUALCAST_WITH_CUDA)
  message(STATUS "dualcast: NCCL disabled (DUALCAST_ENABLE_NCCL=OFF): data-parallel training runs on "
                 "the CPU collective only")
endif()
