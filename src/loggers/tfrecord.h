#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace fulgor::detail {

/// CRC-32C (Castagnoli), as TFRecord files use it.
uint32_t crc32c(std::string_view data);

/// One TFRecord: the length (8 bytes, little-endian), its masked CRC-32C, the
/// data, and the data's masked CRC-32C.
std::string tfrecord(std::string_view data);

}  // namespace fulgor::detail
