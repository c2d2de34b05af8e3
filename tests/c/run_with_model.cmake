# Runs a program of the C API's tests on tests/jit/torchscript_model.py's
# TorchScript network, made by python3-torch in a fresh folder:
#   cmake -DPROGRAM=... -DMAKE_MODEL=.../torchscript_model.py -DKIND=c|fortran -P run_with_model.cmake
# KIND c:       PROGRAM MODEL.pt NOT_A_MODEL DIR
# KIND fortran: PROGRAM MODEL.pt DIR/fortran.ckpt
# KIND multiarg: MAKE_MODEL is tests/c/multiarg_model.py; PROGRAM DIR, run
#                from DIR's parent
include(${CMAKE_CURRENT_LIST_DIR}/fresh_folder.cmake)
fresh_folder(dir fulgor-c-api)
if(KIND STREQUAL "multiarg")
  execute_process(COMMAND /usr/bin/python3 -W ignore ${MAKE_MODEL} ${dir} RESULT_VARIABLE made)
else()
  execute_process(COMMAND /usr/bin/python3 -W ignore ${MAKE_MODEL} make ${dir} ${dir}/keys.json RESULT_VARIABLE made)
endif()
if(NOT made EQUAL 0)
  file(REMOVE_RECURSE ${dir})
  message(FATAL_ERROR "python3 ${MAKE_MODEL} failed (${made}): the test needs python3-torch")
endif()
file(WRITE ${dir}/not_a_model.txt "plain text\n")
if(KIND STREQUAL "multiarg")
  get_filename_component(parent ${dir} DIRECTORY)
  execute_process(COMMAND ${PROGRAM} ${dir} WORKING_DIRECTORY ${parent} RESULT_VARIABLE result)
elseif(KIND STREQUAL "fortran")
  execute_process(COMMAND ${PROGRAM} ${dir}/scripted.pt ${dir}/fortran.ckpt RESULT_VARIABLE result)
else()
  execute_process(COMMAND ${PROGRAM} ${dir}/scripted.pt ${dir}/not_a_model.txt ${dir} RESULT_VARIABLE result)
endif()
file(REMOVE_RECURSE ${dir})
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} failed: ${result}")
endif()
