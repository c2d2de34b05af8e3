#pragma once

// Reading the dicts that torch.load gives.

#include <ATen/core/ivalue.h>

#include <string>

namespace fulgor::detail {

/// The value of `key` in `dict`; nullptr where `dict` is not a dict or holds
/// no such key.
inline const c10::IValue* find_in(const c10::IValue& dict, const std::string& key) {
  if (!dict.isGenericDict()) return nullptr;
  const c10::impl::GenericDict& d = dict.toGenericDict();
  const auto found = d.find(key);
  return found == d.end() ? nullptr : &found->value();
}

}  // namespace fulgor::detail
