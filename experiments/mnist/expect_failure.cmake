# expect_failure.cmake: runs CMD (a ;-list), passes when it exits non-zero and its output (stdout and
# stderr) matches REGEX. Used by the mnist_train rejection tests.
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit, got 0; output:\n${all}")
endif()
if(NOT all MATCHES "${REGEX}")
  message(FATAL_ERROR "exit ${rc}, but the output does not match '${REGEX}':\n${all}")
endif()
message(STATUS "exit ${rc} as expected: ${all}")
