#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "fulgor/core/export.h"
#include "fulgor/interop/state_dict.h"

namespace fulgor {

/// The contents of a .safetensors file.
struct Safetensors {
  StateDict tensors;                            ///< in the order of their data in the file
  std::map<std::string, std::string> metadata;  ///< the header's "__metadata__"
};

/// Reads a .safetensors file (Hugging Face's format: an 8-byte little-endian
/// header length, a JSON header naming each tensor's dtype, shape and data
/// offsets, then the data), validated as the format's own reader does.
///
/// Ensures: the tensors alias the memory-mapped file (copy-on-write), or are
/// copied where the file leaves them misaligned for their dtype.
/// Throws InteropError naming the file and what is wrong: a header over
/// 100 MB or past the end of the file, a header that is not a JSON object,
/// a duplicate name, offsets that are not contiguous and non-overlapping
/// from the data's start to the file's end, a size that is not dtype size
/// times shape, a "__metadata__" that is not a map of strings, or a dtype
/// this LibTorch lacks (named: U16, U32, U64, F8_* on 1.13).
FULGOR_API Safetensors read_safetensors(const std::filesystem::path& path);

/// Writes `tensors` (contiguous copies of them: the format has no views or
/// shared storages) with `metadata` as a .safetensors file that the format's
/// own reader, and read_safetensors, accept; replaced whole or not at all.
/// Throws InteropError for a dtype the format has no name for.
FULGOR_API void write_safetensors(const StateDict& tensors, const std::filesystem::path& path,
                                  const std::map<std::string, std::string>& metadata = {});

}  // namespace fulgor
