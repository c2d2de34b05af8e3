# Configures fulgor twice in scratch folders, with the tests and extras off:
# as given, which must not warn, and with -static-libstdc++, which must warn
# that programs link libstdc++ statically (Note [libstdc++ first] in
# CMakeLists.txt). Run with cmake -P; see tests/CMakeLists.txt.
file(REMOVE_RECURSE ${WORK_DIR})
foreach(kind dynamic static)
  set(flags -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DFULGOR_BUILD_TESTS=OFF -DFULGOR_BUILD_EXAMPLES=OFF
            -DFULGOR_BUILD_BENCHMARKS=OFF -DFULGOR_BUILD_CONFORMANCE=OFF)
  if(kind STREQUAL "static")
    list(APPEND flags -DCMAKE_EXE_LINKER_FLAGS=-static-libstdc++)
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${FULGOR_SOURCE_DIR} -B ${WORK_DIR}/${kind} ${flags}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "configuring with a ${kind} libstdc++ failed (${rc}):\n${out}\n${err}")
  endif()
  # CMake wraps warnings at spaces.
  set(warned OFF)
  if(err MATCHES "link[ \n]+libstdc\\+\\+[ \n]+statically")
    set(warned ON)
  endif()
  if(kind STREQUAL "dynamic" AND warned)
    message(FATAL_ERROR "configuring as given warned of a static libstdc++:\n${err}")
  elseif(kind STREQUAL "static" AND NOT warned)
    message(FATAL_ERROR "configuring with -static-libstdc++ did not warn:\n${err}")
  endif()
endforeach()
message(STATUS "a static libstdc++ is named at configure time, a dynamic one is not")
