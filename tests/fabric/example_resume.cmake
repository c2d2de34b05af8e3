# examples/fabric stopped after 2 of 4 epochs and run again resumes from its
# checkpoint and ends with the summary of the run that was never stopped, to
# the last digit, on one process and on two (which the program starts
# itself). Run with cmake -P, PROGRAM and WORK_DIR set; see tests/CMakeLists.txt.
file(REMOVE_RECURSE ${WORK_DIR})

# The last line of the program's output, its JSON summary, into `var`.
function(summary var devices epochs dir)
  execute_process(COMMAND ${PROGRAM} --accelerator=cpu --devices=${devices} --epochs=${epochs} --dir=${dir}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 240)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fabric_spirals --devices=${devices} --epochs=${epochs} failed (${rc}):\n${out}\n${err}")
  endif()
  string(STRIP "${out}" out)
  string(REGEX REPLACE ".*\n" "" last "${out}")
  set(${var} "${last}" PARENT_SCOPE)
  set(output "${out}" PARENT_SCOPE)
endfunction()

foreach(devices 1 2)
  set(dir ${WORK_DIR}/devices${devices})
  summary(whole ${devices} 4 ${dir}/whole)
  summary(first_half ${devices} 2 ${dir}/resumed)
  summary(resumed ${devices} 4 ${dir}/resumed)
  if(NOT output MATCHES "resumed at epoch 2")
    message(FATAL_ERROR "devices=${devices}: the second run did not resume:\n${output}")
  endif()
  if(NOT whole MATCHES "\"world_size\":${devices}")
    message(FATAL_ERROR "devices=${devices}: not trained on ${devices} processes: ${whole}")
  endif()
  if(NOT resumed STREQUAL whole)
    message(FATAL_ERROR "devices=${devices}: the resumed run ends with\n  ${resumed}\nthe uninterrupted one with\n  ${whole}")
  endif()
  message(STATUS "devices=${devices}: resumed at epoch 2, ends as the uninterrupted run: ${whole}")
endforeach()
