#pragma once

#include <torch/serialize/input-archive.h>

#include <string>

#include "detail/regular_file.h"

namespace fulgor::detail {

/// read_checkpoint_file of `file`, already open: the descriptor whose format
/// a caller told is the one read (Note [Opening a user's path]).
torch::serialize::InputArchive read_checkpoint_file(const RegularFile& file, const std::string& path);

}  // namespace fulgor::detail
