#pragma once

#include <ATen/core/ivalue.h>

#include <filesystem>

#include "fulgor/core/export.h"
#include "fulgor/interop/state_dict.h"

namespace fulgor {

/// Writes `value` as Python's torch.save does (the zip format, records
/// 64-byte aligned, by LibTorch's own zip writer), so that
/// torch.load(path, weights_only=True) reads it on torch 1.13 and 2.x
/// (Note [Pickles Python's weights-only reader takes] in
/// src/interop/pickle_writer.h).
///
/// Requires: `value` holds only dicts, lists, tuples, strings, ints, floats,
/// bools, None and tensors of the dtypes torch.load knows. Floats are read by
/// torch 2.x's weights-only reader, not by 1.13's (use weights_only=False
/// there).
/// Ensures: the file is replaced whole or not at all; tensors that share a
/// storage here share one in Python, with their offsets and strides; tensors
/// on a device are written from a copy on the CPU and load onto the CPU.
/// Throws InteropError naming the path or the value that cannot be written.
FULGOR_API void torch_save(const c10::IValue& value, const std::filesystem::path& path);

/// Writes `state` as Module.state_dict() is saved: an OrderedDict of tensors,
/// which the equivalent Python module's load_state_dict takes, after
/// torch.load(path, weights_only=True) on torch 1.13 and 2.x.
FULGOR_API void save_state_dict(const StateDict& state, const std::filesystem::path& path);

/// save_state_dict of the module's parameters and buffers, by the names
/// state_dict_of gives them.
FULGOR_API void save_state_dict(const torch::nn::Module& module, const std::filesystem::path& path);

}  // namespace fulgor
