# Runs tests/c/data_parallel_test.c on 2 ranks through fulgor-run, once per
# configuration (ddp, ZeRO-1, SHARD_GRAD_OP, and SHARD_GRAD_OP saving a sharded
# checkpoint's folder), on tests/c/multiarg_model.py's
# model, and checks that both ranks end with the same predictions:
#   cmake -DPROGRAM=... -DRUN=fulgor-run -DMAKE_MODEL=.../multiarg_model.py -P run_data_parallel.cmake
include(${CMAKE_CURRENT_LIST_DIR}/fresh_folder.cmake)
fresh_folder(dir fulgor-c-data-parallel)
execute_process(COMMAND /usr/bin/python3 -W ignore ${MAKE_MODEL} ${dir} RESULT_VARIABLE made)
if(NOT made EQUAL 0)
  file(REMOVE_RECURSE ${dir})
  message(FATAL_ERROR "python3 ${MAKE_MODEL} failed (${made}): the test needs python3-torch")
endif()
set(common "\"accelerator\": \"cpu\", \"loss\": {\"type\": \"torchscript\", \"path\": \"loss.pt\"}, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}, \"ddp_timeout\": 120")
file(WRITE ${dir}/ddp.json "{${common}, \"strategy\": \"ddp\"}")
file(WRITE ${dir}/zero1.json "{${common}, \"strategy\": \"ddp\", \"zero_redundancy_optimizer\": true}")
file(WRITE ${dir}/shard_grad_op.json "{${common}, \"strategy\": \"fsdp\", \"sharding_strategy\": \"shard_grad_op\"}")
file(WRITE ${dir}/shard_grad_op_folder.json
     "{${common}, \"strategy\": \"fsdp\", \"sharding_strategy\": \"shard_grad_op\", \"state_dict_type\": \"sharded\"}")
set(failed "")
foreach(config ddp zero1 shard_grad_op shard_grad_op_folder)
  execute_process(COMMAND ${RUN} --nproc-per-node 2 -- ${PROGRAM} ${dir} ${config}.json ${dir}/${config}
                  RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output TIMEOUT 300)
  message("${config}: ${output}")
  if(NOT result EQUAL 0)
    list(APPEND failed "${config} exited ${result}")
    continue()
  endif()
  file(READ ${dir}/${config}.rank0 rank0 HEX)
  file(READ ${dir}/${config}.rank1 rank1 HEX)
  if(NOT rank0 STREQUAL rank1 OR rank0 STREQUAL "")
    list(APPEND failed "${config}: the ranks' predictions differ")
  endif()
endforeach()
file(REMOVE_RECURSE ${dir})
if(failed)
  message(FATAL_ERROR "${failed}")
endif()
