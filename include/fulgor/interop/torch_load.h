#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>

#include "fulgor/core/export.h"

namespace fulgor {

/// How torch_load reads a file.
struct TorchLoadOptions {
  /// The device every tensor is loaded onto, whatever device it was saved
  /// from (cpu, cuda:1, npu:0, mps, xpu, privateuseone). Empty: the CPU,
  /// where the tensors alias the memory-mapped file.
  std::optional<c10::Device> map_location;
  /// Check each record's CRC-32, as torch.load does; off only for files known
  /// to be intact.
  bool verify_checksums = true;
};

/// Reads a file written by Python's torch.save (the zip format of torch 1.6
/// and later) or by fulgor::save_state_dict, with a pickle reader that
/// accepts what torch.load(weights_only=True) accepts and runs nothing
/// (Note [A pickle reader that runs nothing] in src/archive/pickle_reader.h).
///
/// Requires: `path` names a torch.save zip archive.
/// Ensures: returns the saved object as LibTorch values: dicts (OrderedDict
/// too) in their order, lists, tuples, strings, ints, floats, bools, None;
/// sets become lists, bytes strings, torch.Size a tuple of ints, a dtype its
/// c10::ScalarType as an int, a torch.device a c10::Device (or its string
/// where this LibTorch cannot name it), ints beyond int64 (up to 4300
/// digits) their decimal string. Tensors that shared a storage in Python share one here, with their
/// offsets and strides. On the CPU, storages alias the file, mapped
/// copy-on-write: nothing is copied, and writing to a tensor never changes the
/// file.
/// Throws InteropError naming the file and the problem: not a zip archive,
/// truncated, a failed CRC, a big-endian file, a global outside the
/// allow-list (named), a malformed pickle, or one beyond the limits of
/// Note [Pickles from elsewhere] (nesting, recursion, memo, dict keys).
FULGOR_API c10::IValue torch_load(const std::filesystem::path& path, const TorchLoadOptions& options = {});

}  // namespace fulgor
