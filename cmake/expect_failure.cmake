# expect_failure.cmake: runs CMD (a ;-list) and passes when it exits with status EXPECT_RC (any
# non-zero status when EXPECT_RC is not given) and its stdout + stderr match REGEX and/or contain
# EXPECT_LINE (a literal substring). Used by the experiments' rejection tests
# (cmake/DriverRejections.cmake).
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(DEFINED EXPECT_RC)
  if(NOT rc STREQUAL "${EXPECT_RC}")
    message(FATAL_ERROR "expected exit status ${EXPECT_RC}, got ${rc}; output:\n${all}")
  endif()
elseif(rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit, got 0; output:\n${all}")
endif()
if(DEFINED REGEX AND NOT all MATCHES "${REGEX}")
  message(FATAL_ERROR "exit ${rc}, but the output does not match '${REGEX}':\n${all}")
endif()
if(DEFINED EXPECT_LINE)
  string(FIND "${all}" "${EXPECT_LINE}" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "exit ${rc}, but the output does not contain '${EXPECT_LINE}':\n${all}")
  endif()
endif()
message(STATUS "exit ${rc} as expected: ${all}")
