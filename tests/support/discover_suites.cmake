# Registers a GoogleTest executable's tests with ctest, one test per test
# suite (Note [One ctest per test suite] in tests/CMakeLists.txt). Run after
# each link of the executable:
#   cmake -DPROGRAM=EXE -DOUTPUT=FILE -DTESTS_DIR=DIR -DTIMEOUT=SECONDS
#         [-DENVIRONMENT=NAME=VALUE] [-DFIXTURES_REQUIRED=NAME] -P discover_suites.cmake
# writes to FILE the add_test and set_tests_properties calls that ctest reads.
# Each test is labelled with the folder of tests/ its source file is in, so
# `ctest -L checkpoint` runs the tests of src/checkpoint/.
cmake_minimum_required(VERSION 3.19)  # string(JSON)

set(listing ${OUTPUT}.json)
execute_process(COMMAND ${PROGRAM} --gtest_list_tests --gtest_output=json:${listing}
                RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output TIMEOUT 60)
if(NOT status EQUAL 0 OR NOT EXISTS ${listing})
  message(FATAL_ERROR "${PROGRAM} --gtest_list_tests failed (${status}):\n${output}")
endif()
file(READ ${listing} json)
file(REMOVE ${listing})

# A bracket argument holds any name ctest may see, without escaping.
function(bracket out text)
  set(${out} "[==[${text}]==]" PARENT_SCOPE)
endfunction()

# The folder of tests/ that holds `file`, the test's label. The compiler
# gives the path as it was given, absolute or relative to the build.
function(folder_of out file)
  get_filename_component(tests ${TESTS_DIR} NAME)
  if(NOT "/${file}" MATCHES ".*/${tests}/([^/]+)/")
    message(FATAL_ERROR "${PROGRAM}: the test source ${file} is not in a folder of ${TESTS_DIR}")
  endif()
  set(${out} ${CMAKE_MATCH_1} PARENT_SCOPE)
endfunction()

# Appends to `script` the test of `suite`, running its `cases` cases in one
# process, labelled `labels` (a list).
function(add_suite_test suite cases labels)
  math(EXPR timeout "${TIMEOUT} * ${cases}")
  if(timeout GREATER 1500)
    set(timeout 1500)
  endif()
  bracket(name "${suite}")
  bracket(program "${PROGRAM}")
  bracket(filter "--gtest_filter=${suite}.*")
  bracket(labels "${labels}")
  # Printed by support/skip_record.cpp when every case skipped and none failed.
  bracket(skipped "fulgor: every test of this run was skipped")
  set(properties LABELS ${labels} TIMEOUT ${timeout} COST ${cases} SKIP_REGULAR_EXPRESSION ${skipped})
  if(ENVIRONMENT)
    bracket(environment "${ENVIRONMENT}")
    list(APPEND properties ENVIRONMENT ${environment})
  endif()
  if(FIXTURES_REQUIRED)
    list(APPEND properties FIXTURES_REQUIRED ${FIXTURES_REQUIRED})
  endif()
  list(JOIN properties " " properties)
  string(APPEND script "add_test(${name} ${program} ${filter})\n"
                       "set_tests_properties(${name} PROPERTIES ${properties})\n")
  set(script "${script}" PARENT_SCOPE)
endfunction()

set(script "")
string(JSON suite_count LENGTH "${json}" testsuites)
math(EXPR last_suite "${suite_count} - 1")
foreach(s RANGE ${last_suite})
  string(JSON suite GET "${json}" testsuites ${s} name)
  string(JSON case_count LENGTH "${json}" testsuites ${s} testsuite)
  math(EXPR last_case "${case_count} - 1")
  set(labels "")
  foreach(c RANGE ${last_case})
    string(JSON file GET "${json}" testsuites ${s} testsuite ${c} file)
    folder_of(label "${file}")
    list(APPEND labels ${label})
  endforeach()
  list(REMOVE_DUPLICATES labels)
  add_suite_test("${suite}" ${case_count} "${labels}")
endforeach()
file(WRITE ${OUTPUT} "${script}")
