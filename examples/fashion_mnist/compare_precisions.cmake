# Trains the example's MLP for one epoch at precision 32 and at bf16-mixed and
# checks that bf16-mixed reaches the fp32 test accuracy to within one point.
# -DEXAMPLE=path -DWORK_DIR=folder

# An accuracy in [0, 1] as an integer number of hundredths of a point.
function(to_ten_thousandths value out)
  if(NOT value MATCHES "^([01])(\\.([0-9]*))?")
    message(FATAL_ERROR "test_acc is not a number in [0, 1]: ${value}")
  endif()
  string(SUBSTRING "${CMAKE_MATCH_3}0000" 0 4 fraction)
  math(EXPR result "${CMAKE_MATCH_1} * 10000 + ${fraction}")
  set(${out} ${result} PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
foreach(precision 32 bf16-mixed)
  file(MAKE_DIRECTORY "${WORK_DIR}/${precision}")
  execute_process(
    COMMAND "${EXAMPLE}" --model.arch=mlp --trainer.max_epochs=1 --trainer.accelerator=cpu --trainer.seed=1
            --trainer.precision=${precision} --trainer.enable_progress_bar=false
    WORKING_DIRECTORY "${WORK_DIR}/${precision}"
    RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE errors)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "fashion_mnist at precision ${precision} exited with ${status}:\n${output}\n${errors}")
  endif()
  string(STRIP "${output}" output)
  string(REGEX MATCH "[^\n]*$" last_line "${output}")
  string(JSON accuracy_${precision} GET "${last_line}" test_acc)
  message(STATUS "precision ${precision}: ${last_line}")
endforeach()
to_ten_thousandths("${accuracy_32}" fp32)
to_ten_thousandths("${accuracy_bf16-mixed}" bf16)
if(fp32 LESS 8000)
  message(FATAL_ERROR "fp32 reached only ${accuracy_32} test accuracy: the comparison means nothing below 0.80")
endif()
math(EXPR difference "${bf16} - ${fp32}")
if(difference LESS -100 OR difference GREATER 100)
  message(FATAL_ERROR "bf16-mixed reached ${accuracy_bf16-mixed} test accuracy, fp32 ${accuracy_32}: "
                      "more than one point apart")
endif()
