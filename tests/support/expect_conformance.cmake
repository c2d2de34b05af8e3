# Runs fulgor-conformance (CONFORMANCE) with ARGUMENTS, separated by '|', and
# passes only when it exits with EXPECTED_STATUS and its output matches the
# regular expression EXPECTED_OUTPUT; after failed checks (status 1) the summary
# line must count EXPECTED_FAILED of them. Run with cmake -P; see
# tests/CMakeLists.txt.
string(REPLACE "|" ";" arguments "${ARGUMENTS}")
execute_process(COMMAND ${CONFORMANCE} ${arguments} RESULT_VARIABLE status OUTPUT_VARIABLE output
                ERROR_VARIABLE output)
message("${output}")
if(NOT status STREQUAL EXPECTED_STATUS)
  message(FATAL_ERROR "fulgor-conformance exited with ${status}, expected ${EXPECTED_STATUS}")
endif()
if(NOT output MATCHES "${EXPECTED_OUTPUT}")
  message(FATAL_ERROR "the output does not match: ${EXPECTED_OUTPUT}")
endif()
if(status EQUAL 1 AND NOT output MATCHES "\n[0-9]+ passed, ${EXPECTED_FAILED} failed\n$")
  message(FATAL_ERROR "the output does not end with a summary line counting ${EXPECTED_FAILED} failed checks")
endif()
