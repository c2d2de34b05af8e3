#pragma once

// Note [Pickles Python's weights-only reader takes]
// torch.load(weights_only=True) is the default from torch 2.6, and torch
// 1.13's version of it knows only some opcodes: no BINFLOAT, no protocol 4
// framing. fulgor writes protocol 2 with the opcodes both know (floats are
// written with BINFLOAT, which only 2.x's reader takes: state dicts have none)
// and only globals both allow: collections.OrderedDict,
// torch._utils._rebuild_tensor_v2 and the typed storage classes.

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fulgor/interop/state_dict.h"

namespace fulgor::detail {

/// A storage the pickle refers to by key, to be written as data/<key>.
struct PickledStorage {
  std::string key;
  torch::Tensor flat;  ///< one-dimensional, over the whole storage, on the CPU
};

/// Writes LibTorch values as a torch.save pickle: dicts, lists, tuples,
/// strings, ints, floats, bools, None and tensors. Tensors sharing a storage
/// keep sharing it, with their offsets and strides.
class PickleWriter {
 public:
  /// Starts the pickle (PROTO 2).
  PickleWriter();
  /// Appends `value`; throws InteropError for a value Python cannot read back.
  void write(const c10::IValue& value);
  /// Appends a state dict as a collections.OrderedDict, as Module.state_dict().
  void write_ordered(const StateDict& state);
  /// Ends the pickle; returns its bytes.
  std::string finish();
  const std::vector<PickledStorage>& storages() const { return storages_; }

 private:
  void op(uint8_t code) { out_.push_back(static_cast<char>(code)); }
  void global(const char* module, const char* name);
  void integer(int64_t value);
  void string(const std::string& value);
  void tensor(const torch::Tensor& tensor);
  void int_tuple(c10::IntArrayRef values);
  std::string out_;
  std::vector<PickledStorage> storages_;
  std::map<const void*, size_t> storage_index_;
};

}  // namespace fulgor::detail
