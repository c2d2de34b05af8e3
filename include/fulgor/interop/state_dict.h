#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>
#include <torch/ordered_dict.h>
#include <torch/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "fulgor/core/export.h"

namespace fulgor {

/// Tensors by name, in order, as Python's Module.state_dict() has them.
using StateDict = torch::OrderedDict<std::string, torch::Tensor>;

/// The state dict inside what torch_load returned: a bare dict of tensors,
/// or the dict under "state_dict" (Lightning's .ckpt, and many scripts') or
/// "model" ({model, optimizer} checkpoints). Entries that are not tensors
/// (a state dict's version numbers) are left out.
/// Throws InteropError naming `source` when there is no such dict.
FULGOR_API StateDict state_dict_from(const c10::IValue& loaded, const std::string& source);

/// The module's parameters and buffers by their dotted names, as Python's
/// state_dict() names those of the equivalent module.
FULGOR_API StateDict state_dict_of(const torch::nn::Module& module);

/// How a file's keys are matched to a module's names.
struct LoadStateDictOptions {
  /// Every key and tensor must match the module's: any missing, unexpected or
  /// mismatched key throws before anything is loaded.
  bool strict = true;
  /// Removed from the front of each key that has it: "model." for a
  /// LightningModule that holds the network as `self.model`, "module." for
  /// DataParallel's.
  std::string strip_prefix;
  /// Put in front of each key (after strip_prefix).
  std::string add_prefix;
  /// Applied last to each key; returning "" drops the entry.
  std::function<std::string(const std::string&)> rename;
};

/// A key present in both whose tensors differ in shape or dtype.
struct StateDictMismatch {
  std::string key;
  std::vector<int64_t> file_shape, module_shape;
  c10::ScalarType file_dtype, module_dtype;
};

/// What did not match, as Python's load_state_dict reports it (with dtypes
/// too); empty when everything was loaded.
struct FULGOR_API LoadStateDictResult {
  std::vector<std::string> missing_keys;        ///< the module's, absent from the file
  std::vector<std::string> unexpected_keys;     ///< the file's (after renaming), unknown to the module
  std::vector<StateDictMismatch> mismatched_keys;  ///< left as they were
  bool all_matched() const { return missing_keys.empty() && unexpected_keys.empty() && mismatched_keys.empty(); }
  /// One line naming every key that did not match.
  std::string describe() const;
};

/// Copies the tensors of `state` into the module's parameters and buffers of
/// the same names (after the options' renaming), on the module's devices.
/// Ensures: every matched key is loaded; with strict, either all keys match
/// and all are loaded, or InteropError lists every mismatch and nothing is
/// loaded; without strict, the mismatches are returned.
FULGOR_API LoadStateDictResult load_state_dict(torch::nn::Module& module, const StateDict& state,
                                               const LoadStateDictOptions& options = {});

/// Reads `path` (a torch.save state dict, a {"state_dict": ...} or
/// {"model": ...} container, a Lightning .ckpt) with torch_load and loads it
/// as above; errors name the file.
FULGOR_API LoadStateDictResult load_state_dict(torch::nn::Module& module, const std::filesystem::path& path,
                                               const LoadStateDictOptions& options = {});

}  // namespace fulgor
