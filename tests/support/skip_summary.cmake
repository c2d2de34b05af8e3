# Prints, after the test summary of a ctest run, why each skipped test was
# skipped: the reasons those tests recorded in RECORDS, a file each, its first
# line the test's name (Note [Skip reasons on the terminal] in
# tests/CMakeLists.txt). ctest runs it as its CTEST_CUSTOM_POST_TEST:
#   cmake -DRECORDS=DIR -P skip_summary.cmake
file(GLOB records LIST_DIRECTORIES false "${RECORDS}/*")
if(NOT records)
  return()
endif()
list(SORT records)
list(LENGTH records count)
# Strings, not lists: a reason may hold a semicolon.
set(text "")
foreach(record IN LISTS records)
  file(READ ${record} content)
  string(FIND "${content}" "\n" end_of_name)
  string(SUBSTRING "${content}" 0 ${end_of_name} name)
  math(EXPR start "${end_of_name} + 1")
  string(SUBSTRING "${content}" ${start} -1 reason)
  string(STRIP "${reason}" reason)
  string(REPLACE "\n" "\n      " reason "${reason}")
  string(APPEND text "\n  ${name}: ${reason}")
endforeach()
if(count EQUAL 1)
  message("\nWhy the skipped test was skipped:${text}")
else()
  message("\nWhy the ${count} skipped tests were skipped:${text}")
endif()
