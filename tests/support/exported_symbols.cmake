# Lists the dynamic symbols libfulgor defines (nm -D --defined-only -C) and
# fails on any that names fulgor::detail, which stays inside the library
# (Note [Exported symbols] in include/fulgor/core/export.h), and on a missing
# one of the public API that programs and plugins link against.
# Run with cmake -DNM=... -DLIBRARY=... -P; see tests/CMakeLists.txt.
execute_process(COMMAND ${NM} -D --defined-only -C ${LIBRARY} RESULT_VARIABLE rc OUTPUT_VARIABLE symbols
                ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only -C ${LIBRARY} failed (${rc}): ${err}")
endif()
# Matched in the text rather than split into a list: symbol names hold
# brackets and semicolons, which CMake's lists do not keep apart.
string(REGEX MATCHALL "[^\n]*fulgor::detail::[^\n]*" internal "${symbols}")
if(internal)
  string(REPLACE ";" "\n" internal "${internal}")
  message(FATAL_ERROR "${LIBRARY} exports symbols of fulgor::detail:\n${internal}")
endif()
# A class marked FULGOR_API brings its vtable and typeinfo; a function its own symbol.
foreach(expected
    "typeinfo for fulgor::Error"
    "typeinfo for fulgor::ConfigError"
    "typeinfo for fulgor::Callback"
    "vtable for fulgor::Accelerator"
    "vtable for fulgor::DeviceGuardAccelerator"
    "fulgor::AcceleratorRegistry::instance()"
    "fulgor::impl::register_accelerator_at_load("
    "fulgor::Trainer::Trainer("
    "fulgor::Trainer::save_checkpoint("
    "fulgor::ModuleBase::log("
    "fulgor::seed_everything("
    "fulgor::read_checkpoint_file("
    "fulgor::torch_load("
    "fulgor::metrics::Accuracy::"
    "fulgor::StepLR::"
    "vtable for fulgor::SyncBatchNormImpl"
    "fulgor::convert_sync_batchnorm(")
  string(FIND "${symbols}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${LIBRARY} does not export ${expected}")
  endif()
endforeach()
string(REGEX MATCHALL "\n" lines "${symbols}")
list(LENGTH lines count)
message(STATUS "${count} symbols exported, none of fulgor::detail")
