#pragma once

#include <memory>

#include "archive/zip_reader.h"
#include "fulgor/interop/safetensors.h"

namespace fulgor::detail {

/// read_safetensors of a file already in memory (the fuzzers' inputs are).
Safetensors read_safetensors_file(const std::shared_ptr<MappedFile>& file);

}  // namespace fulgor::detail
