# Runs the gan example briefly and checks its JSON summary (the last line of
# output), its metrics and its sample grids, which check_png.py reads back.
# -DEXAMPLE=path -DPYTHON3=path -DWORK_DIR=folder
set(batches 20)
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
execute_process(
  COMMAND "${EXAMPLE}" --trainer.max_epochs=1 --trainer.accelerator=cpu --trainer.limit_train_batches=${batches}
          --trainer.log_every_n_steps=5
  WORKING_DIRECTORY "${WORK_DIR}"
  RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE errors)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "gan exited with ${status}:\n${output}\n${errors}")
endif()
string(STRIP "${output}" output)
string(REGEX MATCH "[^\n]*$" last_line "${output}")
foreach(key g_loss d_loss epochs global_step samples seconds)
  string(JSON value ERROR_VARIABLE missing GET "${last_line}" ${key})
  if(missing)
    message(FATAL_ERROR "the last line has no '${key}': ${last_line}")
  endif()
endforeach()
string(JSON epochs GET "${last_line}" epochs)
string(JSON global_step GET "${last_line}" global_step)
string(JSON accelerator GET "${last_line}" accelerator)
string(JSON g_loss TYPE "${last_line}" g_loss)
string(JSON d_loss TYPE "${last_line}" d_loss)
# Two optimizer steps per batch: the generator's and the discriminator's.
math(EXPR expected_steps "2 * ${batches}")
if(NOT epochs EQUAL 1 OR NOT global_step EQUAL expected_steps OR NOT accelerator STREQUAL "cpu"
   OR NOT g_loss STREQUAL "NUMBER" OR NOT d_loss STREQUAL "NUMBER")
  message(FATAL_ERROR "unexpected summary (expected 1 epoch, global_step ${expected_steps}, numeric losses): "
                      "${last_line}")
endif()

set(run "${WORK_DIR}/gan_logs/lightning_logs/version_0")
string(JSON samples GET "${last_line}" samples)
if(NOT samples STREQUAL "gan_logs/lightning_logs/version_0/samples.png")
  message(FATAL_ERROR "samples in ${samples}, expected under ${run}")
endif()
file(READ "${run}/metrics.csv" metrics LIMIT 4096)
string(REGEX MATCH "^[^\n]*" header "${metrics}")
if(NOT header MATCHES "(^|,)g_loss(,|$)" OR NOT header MATCHES "(^|,)d_loss(,|$)")
  message(FATAL_ERROR "metrics.csv's columns are ${header}: expected g_loss and d_loss")
endif()
foreach(png samples_epoch_0.png samples.png)
  execute_process(COMMAND "${PYTHON3}" "${CMAKE_CURRENT_LIST_DIR}/check_png.py" "${run}/${png}"
                  RESULT_VARIABLE png_status OUTPUT_VARIABLE png_output ERROR_VARIABLE png_errors)
  if(NOT png_status EQUAL 0)
    message(FATAL_ERROR "${png}:\n${png_output}${png_errors}")
  endif()
  message(STATUS "${png_output}")
endforeach()
file(GLOB leftovers "${run}/.*.tmp.*")
if(leftovers)
  message(FATAL_ERROR "temporary files left behind: ${leftovers}")
endif()
message(STATUS "${last_line}")
