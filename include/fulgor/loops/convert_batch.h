#pragma once

// The conversion of a batch's inputs for the "-true" precisions, done by the
// loops after the batch reaches the device.

#include <torch/data/example.h>
#include <torch/types.h>

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fulgor/precision/precision.h"

namespace fulgor::detail {

/// Converts the floating-point tensors of a batch for a "-true" precision.
/// Walks the batch types move_batch knows (tensors, Examples, pairs, tuples,
/// vectors, maps); other types pass unchanged, since fulgor cannot see into
/// them: a module with such a batch converts its inputs itself, with
/// Precision::convert_input (see docs/precision.md).
template <typename T>
T convert_batch(T batch, const Precision& precision);

template <typename T, typename = void>
struct BatchConvert {
  static T convert(T batch, const Precision&) { return batch; }
};

template <>
struct BatchConvert<torch::Tensor> {
  static torch::Tensor convert(torch::Tensor t, const Precision& p) { return p.convert_input(t); }
};

template <typename Data, typename Target>
struct BatchConvert<torch::data::Example<Data, Target>> {
  static torch::data::Example<Data, Target> convert(torch::data::Example<Data, Target> e, const Precision& p) {
    e.data = convert_batch(std::move(e.data), p);
    // Targets are converted too, so that a regression loss sees matching
    // dtypes; integer class labels are left as they are.
    e.target = convert_batch(std::move(e.target), p);
    return e;
  }
};

template <typename Data>
struct BatchConvert<torch::data::Example<Data, torch::data::example::NoTarget>> {
  using Example = torch::data::Example<Data, torch::data::example::NoTarget>;
  static Example convert(Example e, const Precision& p) {
    e.data = convert_batch(std::move(e.data), p);
    return e;
  }
};

template <typename A, typename B>
struct BatchConvert<std::pair<A, B>> {
  static std::pair<A, B> convert(std::pair<A, B> v, const Precision& p) {
    return {convert_batch(std::move(v.first), p), convert_batch(std::move(v.second), p)};
  }
};

template <typename... Ts>
struct BatchConvert<std::tuple<Ts...>> {
  static std::tuple<Ts...> convert(std::tuple<Ts...> t, const Precision& p) {
    return std::apply([&](auto&&... items) { return std::tuple<Ts...>(convert_batch(std::move(items), p)...); },
                      std::move(t));
  }
};

template <typename T, typename Alloc>
struct BatchConvert<std::vector<T, Alloc>> {
  static std::vector<T, Alloc> convert(std::vector<T, Alloc> v, const Precision& p) {
    for (auto& item : v) item = convert_batch(std::move(item), p);
    return v;
  }
};

template <typename K, typename V, typename... Rest>
struct BatchConvert<std::map<K, V, Rest...>> {
  static std::map<K, V, Rest...> convert(std::map<K, V, Rest...> m, const Precision& p) {
    for (auto& entry : m) entry.second = convert_batch(std::move(entry.second), p);
    return m;
  }
};

template <typename K, typename V, typename... Rest>
struct BatchConvert<std::unordered_map<K, V, Rest...>> {
  static std::unordered_map<K, V, Rest...> convert(std::unordered_map<K, V, Rest...> m, const Precision& p) {
    for (auto& entry : m) entry.second = convert_batch(std::move(entry.second), p);
    return m;
  }
};

template <typename T>
T convert_batch(T batch, const Precision& precision) {
  return BatchConvert<T>::convert(std::move(batch), precision);
}

}  // namespace fulgor::detail
