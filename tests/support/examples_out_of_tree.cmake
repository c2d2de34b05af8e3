# Installs the fulgor build into a scratch prefix and builds a copy of each
# example of examples/ from its own folder against it, as a user who copied
# them would (find_package(fulgor) must bring what fulgor's headers need; an
# example links what it uses itself; nothing warns), then starts each program
# once to see that it loads (and that a typo on its command line ends it with
# status 2). The C API's programs run whole from there: the C test (tests/c)
# and, WITH_FORTRAN, the Fortran example on the models its make_model and
# make_model.py write. Nothing is found through LD_LIBRARY_PATH: every
# installed library finds what it needs by its RUNPATH. Run with cmake -P; see
# tests/CMakeLists.txt.
file(REMOVE_RECURSE ${WORK_DIR})
unset(ENV{LD_LIBRARY_PATH})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} --install ${FULGOR_BINARY_DIR} --prefix ${WORK_DIR}/prefix)
# examples/ whole: the GAN and the autoencoder read Fashion-MNIST with
# fashion_mnist's reader.
file(COPY ${FULGOR_SOURCE_DIR}/examples DESTINATION ${WORK_DIR})
string(REPLACE "|" ";" cmake_arguments "${CMAKE_ARGUMENTS}")
foreach(example fashion_mnist autoencoder gan image_folder fabric)
  set(build ${WORK_DIR}/build/${example})
  run(${CMAKE_COMMAND} -S ${WORK_DIR}/examples/${example} -B ${build} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
      ${cmake_arguments})
  # find_package(fulgor) configures without a warning (Note [Debian's kineto]).
  if(err MATCHES "CMake Warning")
    message(FATAL_ERROR "configuring ${example} against the installed fulgor warns:\n${err}")
  endif()
  run(${CMAKE_COMMAND} --build ${build})
  if(example STREQUAL "fabric")
    run(${build}/fabric_spirals --help)
    if(NOT out MATCHES "^usage: fabric_spirals")
      message(FATAL_ERROR "fabric_spirals --help, built out of tree, prints no usage:\n${out}")
    endif()
    execute_process(COMMAND ${build}/fabric_spirals --epoch=1 RESULT_VARIABLE rc ERROR_VARIABLE out)
    if(NOT rc EQUAL 2 OR NOT out MATCHES "^fabric_spirals: unknown argument '--epoch=1'; usage: fabric_spirals")
      message(FATAL_ERROR "fabric_spirals --epoch=1 exits with ${rc}, printing:\n${out}")
    endif()
  elseif(example STREQUAL "image_folder")
    execute_process(COMMAND ${build}/${example} RESULT_VARIABLE rc ERROR_VARIABLE out)
    if(NOT rc EQUAL 2 OR NOT out MATCHES "^usage: image_folder DATA_DIR WORK_DIR")
      message(FATAL_ERROR "${example}, built out of tree, does not start (${rc}):\n${out}")
    endif()
  else()
    run(${build}/${example} --help)
    if(NOT out MATCHES "--trainer.max_epochs")
      message(FATAL_ERROR "${example} --help, built out of tree, prints no options:\n${out}")
    endif()
    # A typo ends it through fulgor::run_main: the message and status 2, no abort.
    execute_process(COMMAND ${build}/${example} --trainer.max_epoch=1 RESULT_VARIABLE rc ERROR_VARIABLE out)
    if(NOT rc EQUAL 2 OR NOT out STREQUAL "${example}: --trainer.max_epoch: unknown trainer option 'max_epoch'; did you mean 'max_epochs'?\n")
      message(FATAL_ERROR "${example} --trainer.max_epoch=1 exits with ${rc}, printing:\n${out}")
    endif()
  endif()
  message(STATUS "${example}: built from a copy of its folder against the installed fulgor, and starts")
endforeach()

# Every installed library finds libfulgor beside it.
file(GLOB libraries ${WORK_DIR}/prefix/lib*/libfulgor*.so)
foreach(library ${libraries})
  run(${READELF} -d ${library})
  if(NOT out MATCHES "\\(RUNPATH\\)[^\n]*\\$ORIGIN")
    message(FATAL_ERROR "${library} has no RUNPATH $ORIGIN:\n${out}")
  endif()
endforeach()

# The C API's test, built against the installed fulgor::fulgor_c.
file(WRITE ${WORK_DIR}/c_api/CMakeLists.txt "cmake_minimum_required(VERSION 3.18)
project(c_api_test LANGUAGES C)
find_package(fulgor REQUIRED)
add_executable(c_api_test ${FULGOR_SOURCE_DIR}/tests/c/c_api_test.c)
target_link_libraries(c_api_test PRIVATE fulgor::fulgor_c m)
")
run(${CMAKE_COMMAND} -S ${WORK_DIR}/c_api -B ${WORK_DIR}/build/c_api -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
    ${cmake_arguments})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build/c_api)
set(models ${WORK_DIR}/models)
file(MAKE_DIRECTORY ${models})
run(${PYTHON} -W ignore ${FULGOR_SOURCE_DIR}/tests/jit/torchscript_model.py make ${models} ${models}/keys.json)
file(WRITE ${models}/not_a_model.txt "plain text\n")
run(${WORK_DIR}/build/c_api/c_api_test ${models}/scripted.pt ${models}/not_a_model.txt ${models})
message(STATUS "the C test, built against the installed fulgor, passes")

if(WITH_FORTRAN)
  set(build ${WORK_DIR}/build/fortran)
  run(${CMAKE_COMMAND} -S ${WORK_DIR}/examples/fortran -B ${build} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
      ${cmake_arguments})
  run(${CMAKE_COMMAND} --build ${build})
  execute_process(COMMAND ${build}/fortran_train RESULT_VARIABLE rc ERROR_VARIABLE out)
  if(NOT rc EQUAL 2 OR NOT out MATCHES "^usage: fortran_train MODEL.pt")
    message(FATAL_ERROR "fortran_train without a model does not exit with its usage (${rc}):\n${out}")
  endif()
  run(${build}/make_model ${models}/from_cpp.pt)
  run(${PYTHON} ${WORK_DIR}/examples/fortran/make_model.py ${models}/from_python.pt)
  foreach(model from_cpp from_python)
    run(${build}/fortran_train ${models}/${model}.pt ${models}/${model}.ckpt)
    if(NOT out MATCHES "loss .* -> ")
      message(FATAL_ERROR "fortran_train on ${model}.pt printed no loss:\n${out}")
    endif()
  endforeach()
  message(STATUS "fortran: built from a copy of its folder against the installed fulgor, trains the models "
                 "make_model and make_model.py write")
endif()
