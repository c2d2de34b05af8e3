#include "interop/optimizer_names.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <set>

#include "fulgor/core/error.h"

namespace fulgor::detail {
namespace {

using Dict = c10::impl::GenericDict;

// Whether a key of "state" or an element of "params" is a number (DCP's
// flattening makes the numbers strings).
bool is_number(const c10::IValue& key) {
  if (key.isInt()) return true;
  if (!key.isString()) return false;
  const std::string& text = key.toStringRef();
  return !text.empty() && std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
}

// `state` with each key of "state" and each element of a group's "params"
// replaced by what `rename` makes of it, keyed by `key_type`.
c10::IValue renamed(const c10::IValue& state, const c10::TypePtr& key_type,
                    const std::function<c10::IValue(const c10::IValue&)>& rename) {
  if (!state.isGenericDict()) return state;
  Dict out(c10::StringType::get(), c10::AnyType::get());
  for (const auto& item : state.toGenericDict()) {
    const bool states = item.key().isString() && item.key().toStringRef() == "state";
    const bool groups = item.key().isString() && item.key().toStringRef() == "param_groups";
    if (states && item.value().isGenericDict()) {
      Dict by_key(key_type, c10::AnyType::get());
      for (const auto& parameter : item.value().toGenericDict())
        by_key.insert(rename(parameter.key()), parameter.value());
      out.insert(item.key(), by_key);
    } else if (groups && item.value().isList()) {
      c10::impl::GenericList list(c10::AnyType::get());
      for (const c10::IValue& group : item.value().toListRef()) {
        if (!group.isGenericDict()) {
          list.push_back(group);
          continue;
        }
        Dict copy = group.toGenericDict().copy();
        const auto params = copy.find(std::string("params"));
        if (params != copy.end() && params->value().isList()) {
          c10::impl::GenericList keys(c10::AnyType::get());
          for (const c10::IValue& key : params->value().toListRef()) keys.push_back(rename(key));
          copy.insert_or_assign(std::string("params"), keys);
        }
        list.push_back(copy);
      }
      out.insert(item.key(), list);
    } else {
      out.insert(item.key(), item.value());
    }
  }
  return out;
}

// Whether `state` numbers its parameters: every key of its "state" and
// every element of its groups' "params".
bool numbered(const c10::IValue& state) {
  if (!state.isGenericDict()) return true;
  const Dict dict = state.toGenericDict();
  bool all = true;
  if (const auto states = dict.find(std::string("state")); states != dict.end() && states->value().isGenericDict())
    for (const auto& item : states->value().toGenericDict()) all = all && is_number(item.key());
  if (const auto groups = dict.find(std::string("param_groups")); groups != dict.end() && groups->value().isList())
    for (const c10::IValue& group : groups->value().toListRef()) {
      if (!group.isGenericDict()) continue;
      const Dict g = group.toGenericDict();
      const auto params = g.find(std::string("params"));
      if (params != g.end() && params->value().isList())
        for (const c10::IValue& key : params->value().toListRef()) all = all && is_number(key);
    }
  return all;
}

}  // namespace

ParameterNames parameter_names(const std::vector<const torch::nn::Module*>& modules) {
  ParameterNames names;
  for (const torch::nn::Module* module : modules)
    for (const auto& item : module->named_parameters()) names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  return names;
}

std::optional<std::vector<std::string>> names_of(const std::vector<torch::Tensor>& params,
                                                 const ParameterNames& names) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const torch::Tensor& param : params) {
    const auto found = names.find(param.unsafeGetTensorImpl());
    if (found == names.end() || !seen.insert(found->second).second) return std::nullopt;
    out.push_back(found->second);
  }
  return out;
}

c10::IValue by_parameter_names(const c10::IValue& state, const std::vector<std::string>& keys) {
  return renamed(state, c10::StringType::get(), [&](const c10::IValue& number) -> c10::IValue {
    const int64_t n = number.isInt() ? number.toInt() : std::stoll(number.toStringRef());
    return keys.at(static_cast<size_t>(n));
  });
}

c10::IValue by_parameter_numbers(const c10::IValue& state, const torch::optim::Optimizer& optimizer,
                                 const ParameterNames& names, const std::string& source) {
  if (numbered(state)) return state;
  std::map<std::string, int64_t> number;
  int64_t n = 0;
  for (const auto& group : optimizer.param_groups())
    for (const auto& param : group.params()) {
      if (const auto found = names.find(param.unsafeGetTensorImpl()); found != names.end())
        number.emplace(found->second, n);
      ++n;
    }
  return renamed(state, c10::IntType::get(), [&](const c10::IValue& key) -> c10::IValue {
    const auto found = key.isString() ? number.find(key.toStringRef()) : number.end();
    if (found == number.end())
      throw InteropError(
          fmt::format("{}: the optimizer's state names parameter '{}', which is none of the "
                      "optimizer's {} parameters (by their names in the module)",
                      source, key.isString() ? key.toStringRef() : c10::toString(key.type()), n));
    return found->second;
  });
}

}  // namespace fulgor::detail
