# DualcastCcache.cmake: compile through ccache when it is installed (scripts/setup installs it), for
# C++ and for nvcc alike. Rebuilding an unchanged file then costs a cache lookup instead of a compile,
# also in another clone of the repository: base_dir makes the paths in each command line relative, so
# CI's fresh clone on a machine where a developer built before finds the same entries.
# Off with -DDUALCAST_CCACHE=OFF; a launcher the user set (CMAKE_<LANG>_COMPILER_LAUNCHER) is kept.
option(DUALCAST_CCACHE "Compile through ccache when it is found" ON)
set(DUALCAST_CCACHE_USED OFF)
if(DUALCAST_CCACHE)
  find_program(DUALCAST_CCACHE_PROGRAM ccache)
  if(DUALCAST_CCACHE_PROGRAM)
    # sloppiness: cache a compile even when a header is newer than its start (as in a clone made a
    # moment before the build); entries are keyed on the headers' contents, never their times.
    set(_launcher ${CMAKE_COMMAND} -E env CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}
                  CCACHE_SLOPPINESS=include_file_mtime,include_file_ctime,time_macros
                  ${DUALCAST_CCACHE_PROGRAM})
    foreach(lang CXX CUDA)
      if(NOT DEFINED CMAKE_${lang}_COMPILER_LAUNCHER)
        set(CMAKE_${lang}_COMPILER_LAUNCHER ${_launcher})
      endif()
    endforeach()
    set(DUALCAST_CCACHE_USED ON)
    message(STATUS "dualcast: compiling through ccache (${DUALCAST_CCACHE_PROGRAM})")
  else()
    message(STATUS "dualcast: ccache not found: every build compiles everything (scripts/setup installs it)")
  endif()
endif()
