# Installs the fulgor build into a scratch prefix, builds the example plugin
# installed with it (share/fulgor/examples) against it with find_package(fulgor), and checks that the installed
# fulgor-info lists it and, when built, the installed fulgor-conformance passes
# it, as a vendor would run both. Run with cmake -P; see tests/CMakeLists.txt.
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} --install ${FULGOR_BINARY_DIR} --prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} -S ${WORK_DIR}/prefix/share/fulgor/examples/custom_accelerator -B ${WORK_DIR}/build
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/prefix/bin/fulgor-info --plugin ${WORK_DIR}/build/libfulgor_vcpu.so)
if(NOT out MATCHES "\nvcpu +yes +2 +gloo +-10 ")
  message(FATAL_ERROR "the installed fulgor-info does not list the out-of-tree plugin:\n${out}")
endif()
message(STATUS "out-of-tree plugin listed by the installed fulgor-info")

if(WITH_CONFORMANCE)
  run(${WORK_DIR}/prefix/bin/fulgor-conformance --plugin ${WORK_DIR}/build/libfulgor_vcpu.so --accelerator vcpu)
  if(NOT out MATCHES "\n[1-9][0-9]* passed, 0 failed\n$")
    message(FATAL_ERROR "the installed fulgor-conformance does not pass the out-of-tree plugin:\n${out}")
  endif()
  message(STATUS "the installed fulgor-conformance passes the out-of-tree plugin")
endif()
