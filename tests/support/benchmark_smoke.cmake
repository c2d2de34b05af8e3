# Builds fulgor-benchmarks, which the default build leaves out, and runs
# ARGUMENTS ("|"-separated) of it; fails unless it exits 0 and its output
# matches EXPECTED_OUTPUT. Keeps a benchmark that is run rarely (on a
# machine with a GPU) building and running.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target fulgor-benchmarks
                RESULT_VARIABLE built OUTPUT_VARIABLE build_output ERROR_VARIABLE build_output)
if(NOT built EQUAL 0)
  message(FATAL_ERROR "building fulgor-benchmarks failed:\n${build_output}")
endif()
string(REPLACE "|" ";" arguments "${ARGUMENTS}")
execute_process(COMMAND ${PROGRAM} ${arguments} RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
message("${output}")
if(NOT status EQUAL 0)
  message(FATAL_ERROR "fulgor-benchmarks ${arguments} exited with ${status}")
endif()
if(NOT output MATCHES "${EXPECTED_OUTPUT}")
  message(FATAL_ERROR "fulgor-benchmarks ${arguments}: the output does not match '${EXPECTED_OUTPUT}'")
endif()
