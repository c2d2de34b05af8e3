#include "fulgor/interop/state_dict.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <set>

#include "fulgor/core/error.h"
#include "fulgor/interop/torch_load.h"

namespace fulgor {
namespace {

StateDict tensors_in(const c10::impl::GenericDict& dict) {
  StateDict out;
  for (const auto& entry : dict)
    if (entry.key().isString() && entry.value().isTensor())
      out.insert(entry.key().toStringRef(), entry.value().toTensor());
  return out;
}

std::string renamed(std::string key, const LoadStateDictOptions& options) {
  if (!options.strip_prefix.empty() && key.rfind(options.strip_prefix, 0) == 0) key.erase(0, options.strip_prefix.size());
  key = options.add_prefix + key;
  return options.rename ? options.rename(key) : key;
}

}  // namespace

StateDict state_dict_from(const c10::IValue& loaded, const std::string& source) {
  if (!loaded.isGenericDict())
    throw InteropError(fmt::format("{} holds a {}, not a state dict (a dict of tensors)", source, loaded.tagKind()));
  auto dict = loaded.toGenericDict();
  for (const char* container : {"state_dict", "model"}) {
    auto it = dict.find(std::string(container));
    if (it != dict.end() && it->value().isGenericDict()) return tensors_in(it->value().toGenericDict());
  }
  StateDict bare = tensors_in(dict);
  if (bare.is_empty())
    throw InteropError(fmt::format("{} holds no tensors: neither a state dict nor a dict with one under "
                                   "\"state_dict\" or \"model\"",
                                   source));
  return bare;
}

StateDict state_dict_of(const torch::nn::Module& module) {
  StateDict out;
  for (const auto& p : module.named_parameters()) out.insert(p.key(), p.value());
  for (const auto& b : module.named_buffers()) out.insert(b.key(), b.value());
  return out;
}

std::string LoadStateDictResult::describe() const {
  std::vector<std::string> parts;
  if (!missing_keys.empty()) parts.push_back(fmt::format("missing keys: {}", fmt::join(missing_keys, ", ")));
  if (!unexpected_keys.empty()) parts.push_back(fmt::format("unexpected keys: {}", fmt::join(unexpected_keys, ", ")));
  for (const auto& m : mismatched_keys)
    parts.push_back(fmt::format("{}: the file has {} [{}], the module {} [{}]", m.key, c10::toString(m.file_dtype),
                                fmt::join(m.file_shape, ", "), c10::toString(m.module_dtype),
                                fmt::join(m.module_shape, ", ")));
  return fmt::format("{}", fmt::join(parts, "; "));
}

LoadStateDictResult load_state_dict(torch::nn::Module& module, const StateDict& state,
                                    const LoadStateDictOptions& options) {
  StateDict target = state_dict_of(module);
  LoadStateDictResult result;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;
  std::set<std::string> seen;
  for (const auto& entry : state) {
    std::string key = renamed(entry.key(), options);
    if (key.empty()) continue;
    const torch::Tensor* into = target.find(key);
    if (into == nullptr || !seen.insert(key).second) {
      result.unexpected_keys.push_back(key);
    } else if (into->sizes() != entry.value().sizes() || into->scalar_type() != entry.value().scalar_type()) {
      result.mismatched_keys.push_back({key, entry.value().sizes().vec(), into->sizes().vec(),
                                        entry.value().scalar_type(), into->scalar_type()});
    } else {
      copies.emplace_back(*into, entry.value());
    }
  }
  for (const auto& entry : target)
    if (seen.count(entry.key()) == 0) result.missing_keys.push_back(entry.key());
  if (options.strict && !result.all_matched())
    throw InteropError(fmt::format("the state dict does not match the module (strict): {}", result.describe()));
  torch::NoGradGuard no_grad;
  for (auto& [into, from] : copies) into.copy_(from);
  return result;
}

LoadStateDictResult load_state_dict(torch::nn::Module& module, const std::filesystem::path& path,
                                    const LoadStateDictOptions& options) {
  std::string source = "'" + path.string() + "'";
  StateDict state = state_dict_from(torch_load(path), source);
  try {
    return load_state_dict(module, state, options);
  } catch (const InteropError& e) {
    throw InteropError(source + ": " + e.what());
  }
}

}  // namespace fulgor
