#pragma once

#include <ATen/core/ivalue.h>

#include <string>

namespace fulgor::detail {

/// The bytes torch_save would write for `value`: a torch.save archive in
/// memory (a distributed checkpoint's chunks and objects are such archives
/// at offsets of one file). Throws InteropError as torch_save does.
std::string torch_save_bytes(const c10::IValue& value);

}  // namespace fulgor::detail
