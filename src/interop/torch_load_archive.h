#pragma once

#include <ATen/core/ivalue.h>

#include <memory>

#include "archive/zip_reader.h"
#include "fulgor/interop/torch_load.h"

namespace fulgor::detail {

/// torch_load of a file already in memory (the fuzzers' inputs are).
c10::IValue torch_load_archive(const std::shared_ptr<MappedFile>& file, const TorchLoadOptions& options);

}  // namespace fulgor::detail
