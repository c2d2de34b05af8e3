#pragma once

#include <memory>

#include "fulgor/interop/safetensors.h"
#include "interop/zip_reader.h"

namespace fulgor::detail {

/// read_safetensors of a file already in memory (the fuzzers' inputs are).
Safetensors read_safetensors_file(const std::shared_ptr<MappedFile>& file);

}  // namespace fulgor::detail
