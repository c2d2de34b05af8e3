#pragma once

#include <ATen/core/ivalue.h>

#include <cstddef>
#include <functional>
#include <string>

namespace fulgor::detail {

/// Writes the torch.save archive of `value` through `sink`, which returns
/// how many bytes it took (fewer ends the write with an error).
void torch_save_to(const c10::IValue& value, const std::function<size_t(const void*, size_t)>& sink);

/// The bytes torch_save would write for `value`: a torch.save archive in
/// memory (a distributed checkpoint's chunks and objects are such archives
/// at offsets of one file). Throws InteropError as torch_save does.
std::string torch_save_bytes(const c10::IValue& value);

}  // namespace fulgor::detail
