# DualcastCudnn.cmake: finds cuDNN for GPU convolution, without a hand-set path. On the CPU machines it
# sits with the CUDA toolkit (<cuda>/include, <cuda>/lib64 or targets/<arch>/lib); on the GPU machine it
# is a system package (/usr/include/x86_64-linux-gnu/cudnn.h, /usr/lib/x86_64-linux-gnu/libcudnn.so).
# CUDNN_ROOT (cache or environment) is searched first when set. The result is said either way:
#   "dualcast: cuDNN <version> at <library> (<include dir>)"
#   "dualcast: cuDNN not found: GPU convolution uses dualcast's implicit GEMM on cuBLAS"
# Sets DUALCAST_WITH_CUDNN (ON/OFF), DUALCAST_CUDNN_INCLUDE_DIR, DUALCAST_CUDNN_LIBRARY and
# DUALCAST_CUDNN_VERSION. Option DUALCAST_ENABLE_CUDNN (default ON) turns the search off.
option(DUALCAST_ENABLE_CUDNN "Use cuDNN for GPU convolution when it is found" ON)
set(DUALCAST_WITH_CUDNN OFF)
if(DUALCAST_WITH_CUDA AND DUALCAST_ENABLE_CUDNN)
  set(_cudnn_hints "")
  foreach(root $ENV{CUDNN_ROOT} ${CUDNN_ROOT})
    list(APPEND _cudnn_hints ${root})
  endforeach()
  set(_cudnn_inc_hints ${CUDAToolkit_INCLUDE_DIRS})
  set(_cudnn_lib_hints ${CUDAToolkit_LIBRARY_DIR})
  if(CUDAToolkit_LIBRARY_ROOT)
    list(APPEND _cudnn_inc_hints ${CUDAToolkit_LIBRARY_ROOT}/include)
    list(APPEND _cudnn_lib_hints ${CUDAToolkit_LIBRARY_ROOT}/lib64 ${CUDAToolkit_LIBRARY_ROOT}/lib)
  endif()
  find_path(DUALCAST_CUDNN_INCLUDE_DIR cudnn.h
            HINTS ${_cudnn_hints} ${_cudnn_inc_hints}
            PATH_SUFFIXES include include/x86_64-linux-gnu include/aarch64-linux-gnu x86_64-linux-gnu
                          aarch64-linux-gnu
            DOC "folder of cudnn.h")
  find_library(DUALCAST_CUDNN_LIBRARY cudnn
               HINTS ${_cudnn_hints} ${_cudnn_lib_hints}
               PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu lib/aarch64-linux-gnu x86_64-linux-gnu
               DOC "libcudnn")
  if(DUALCAST_CUDNN_INCLUDE_DIR AND DUALCAST_CUDNN_LIBRARY)
    # The version lives in cudnn_version.h since cuDNN 8 (cudnn.h before); Debian/Ubuntu packages may
    # name it cudnn_version_v9.h (with cudnn_version.h an alternatives link, or missing).
    set(DUALCAST_CUDNN_VERSION "unknown")
    set(_cudnn_major "")
    foreach(f cudnn_version.h cudnn_version_v9.h cudnn_version_v8.h cudnn.h)
      set(_cudnn_file ${DUALCAST_CUDNN_INCLUDE_DIR}/${f})
      if(_cudnn_major STREQUAL "" AND EXISTS ${_cudnn_file})
        file(STRINGS ${_cudnn_file} _cudnn_lines REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
        if(_cudnn_lines)
          set(_cudnn_v "")
          foreach(part MAJOR MINOR PATCHLEVEL)
            string(REGEX MATCH "CUDNN_${part} +([0-9]+)" _m "${_cudnn_lines}")
            list(APPEND _cudnn_v ${CMAKE_MATCH_1})
          endforeach()
          list(JOIN _cudnn_v "." DUALCAST_CUDNN_VERSION)
          list(GET _cudnn_v 0 _cudnn_major)
        endif()
      endif()
    endforeach()
    if(_cudnn_major STREQUAL "" OR _cudnn_major GREATER_EQUAL 8)  # unknown: the compile will tell
      set(DUALCAST_WITH_CUDNN ON)
      message(STATUS "dualcast: cuDNN ${DUALCAST_CUDNN_VERSION} at ${DUALCAST_CUDNN_LIBRARY} "
                     "(${DUALCAST_CUDNN_INCLUDE_DIR})")
    else()
      message(STATUS "dualcast: cuDNN ${DUALCAST_CUDNN_VERSION} at ${DUALCAST_CUDNN_LIBRARY} is older "
                     "than 8: GPU convolution uses dualcast's implicit GEMM on cuBLAS")
    endif()
  else()
    message(STATUS "dualcast: cuDNN not found: GPU convolution uses dualcast's implicit GEMM on cuBLAS "
                   "(set CUDNN_ROOT to point at an installation)")
  endif()
elseif(DUALCAST_WITH_CUDA)
  message(STATUS "dualcast: cuDNN disabled (DUALCAST_ENABLE_CUDNN=OFF): GPU convolution uses "
                 "dualcast's implicit GEMM on cuBLAS")
endif()
