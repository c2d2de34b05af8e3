# Runs the fashion_mnist example briefly and checks its last line of output is
# the JSON summary. -DEXAMPLE=path -DWORK_DIR=folder [-DPRECISION=bf16-mixed]
set(precision_args)
if(PRECISION)
  set(precision_args --trainer.precision=${PRECISION})
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
execute_process(
  COMMAND "${EXAMPLE}" --trainer.max_epochs=1 --trainer.accelerator=cpu --trainer.limit_train_batches=20
          --trainer.limit_val_batches=5 --trainer.limit_test_batches=10 ${precision_args}
  WORKING_DIRECTORY "${WORK_DIR}"
  RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE errors)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "fashion_mnist exited with ${status}:\n${output}\n${errors}")
endif()
string(STRIP "${output}" output)
string(REGEX MATCH "[^\n]*$" last_line "${output}")
foreach(key test_acc test_loss epochs accelerator seconds)
  string(JSON value ERROR_VARIABLE missing GET "${last_line}" ${key})
  if(missing)
    message(FATAL_ERROR "the last line has no '${key}': ${last_line}")
  endif()
endforeach()
string(JSON epochs GET "${last_line}" epochs)
string(JSON accelerator GET "${last_line}" accelerator)
string(JSON global_step GET "${last_line}" global_step)
if(NOT epochs EQUAL 1 OR NOT accelerator STREQUAL "cpu" OR NOT global_step EQUAL 20)
  message(FATAL_ERROR "unexpected summary: ${last_line}")
endif()
if(NOT EXISTS "${WORK_DIR}/fashion_mnist_logs/lightning_logs/version_0/metrics.csv")
  message(FATAL_ERROR "no metrics.csv under ${WORK_DIR}/fashion_mnist_logs")
endif()
message(STATUS "${last_line}")
