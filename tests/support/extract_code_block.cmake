# Writes the first ```cpp code block that follows the line MARKER in the
# Markdown file MARKDOWN into OUTPUT, so that code shown in the docs is
# compiled and tested as written. Fails when there is no such block.
# Run with cmake -P; see tests/support/CMakeLists.txt.
file(READ ${MARKDOWN} text)
string(FIND "${text}" "${MARKER}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${MARKDOWN} has no line '${MARKER}'")
endif()
string(SUBSTRING "${text}" ${at} -1 text)
string(FIND "${text}" "\n```cpp\n" start)
if(start EQUAL -1)
  message(FATAL_ERROR "${MARKDOWN} has no ```cpp block after '${MARKER}'")
endif()
math(EXPR start "${start} + 8")
string(SUBSTRING "${text}" ${start} -1 text)
string(FIND "${text}" "\n```" end)
if(end EQUAL -1)
  message(FATAL_ERROR "the ```cpp block after '${MARKER}' in ${MARKDOWN} does not end")
endif()
math(EXPR end "${end} + 1")
string(SUBSTRING "${text}" 0 ${end} code)
file(WRITE ${OUTPUT} "// Extracted from ${MARKDOWN} by extract_code_block.cmake; edit it there.\n${code}")
