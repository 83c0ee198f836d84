# DriverRejections.cmake: dualcast_driver_rejections(driver) registers one ctest per row of
# experiments/common/bad_command_lines.txt that names `driver`: <driver>.rejects_<name> runs the
# driver with the row's arguments and passes when it exits with the row's status and its output
# contains the row's line (cmake/expect_failure.cmake, literal match). The same rows make up the
# command-line part of docs/bad-input.md (tests/test_bad_input.cu), so that table stays true.
function(dualcast_driver_rejections driver)
  set(_table ${PROJECT_SOURCE_DIR}/experiments/common/bad_command_lines.txt)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_table})
  # Split into lines by hand: a CMake list treats an unbalanced "[" (as in "[0, 1)") as the start
  # of a bracket that hides the following separators, so brackets are masked while splitting.
  file(READ ${_table} _text)
  string(REPLACE "[" "<dualcast-lb>" _text "${_text}")
  string(REPLACE "]" "<dualcast-rb>" _text "${_text}")
  string(REPLACE ";" "<dualcast-sc>" _text "${_text}")
  string(REPLACE "\n" ";" _rows "${_text}")
  set(_data ${PROJECT_SOURCE_DIR}/tests/data)
  foreach(_row IN LISTS _rows)
    string(REPLACE "<dualcast-lb>" "[" _row "${_row}")
    string(REPLACE "<dualcast-rb>" "]" _row "${_row}")
    string(REPLACE "<dualcast-sc>" ";" _row "${_row}")
    if(_row MATCHES "^#" OR _row STREQUAL "")
      continue()
    endif()
    if(NOT _row MATCHES "^([^|]+) \\| ([^|]+) \\| ([0-9]+) \\| (.+) \\| (.*)$")
      message(FATAL_ERROR "${_table}: malformed row: ${_row}")
    endif()
    if(NOT CMAKE_MATCH_1 STREQUAL driver)
      continue()
    endif()
    set(_name ${CMAKE_MATCH_2})
    set(_rc ${CMAKE_MATCH_3})
    string(REPLACE "@DATA@" "${_data}" _line "${CMAKE_MATCH_4}")
    string(REPLACE "@DATA@" "${_data}" _args "${CMAKE_MATCH_5}")
    separate_arguments(_args UNIX_COMMAND "${_args}")
    add_test(NAME ${driver}.rejects_${_name}
             COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=${_rc} "-DEXPECT_LINE=${_line}"
                     "-DCMD=$<TARGET_FILE:${driver}>;${_args}"
                     -P ${PROJECT_SOURCE_DIR}/cmake/expect_failure.cmake)
    set_tests_properties(${driver}.rejects_${_name} PROPERTIES LABELS bad-input)
  endforeach()
endfunction()
