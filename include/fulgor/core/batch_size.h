#pragma once

#include <torch/data/example.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fulgor {

/// How many samples a batch of type T holds, which weights epoch averages of
/// logged metrics. fulgor reads the first dimension of the first tensor it
/// finds in tensors, torch::data::Example, pairs, tuples and maps, and the
/// length of a std::vector (what a loader without collation yields). Other
/// types count as unknown (-1): the Trainer then weights each batch as one
/// sample unless log() is given a batch_size. Specialise it for your own type:
///
///   template <> struct fulgor::BatchSize<MyBatch> {
///     static int64_t of(const MyBatch& b) { return b.image.size(0); }
///   };
template <typename T, typename Enable = void>
struct BatchSize {
  static int64_t of(const T&) { return -1; }
};

template <typename T>
int64_t batch_size_of(const T& batch) {
  return BatchSize<T>::of(batch);
}

template <>
struct BatchSize<torch::Tensor> {
  static int64_t of(const torch::Tensor& t) {
    if (!t.defined()) return -1;
    return t.dim() == 0 ? 1 : t.size(0);
  }
};

template <typename Data, typename Target>
struct BatchSize<torch::data::Example<Data, Target>> {
  static int64_t of(const torch::data::Example<Data, Target>& e) { return batch_size_of(e.data); }
};

template <typename A, typename B>
struct BatchSize<std::pair<A, B>> {
  static int64_t of(const std::pair<A, B>& p) { return batch_size_of(p.first); }
};

template <typename First, typename... Rest>
struct BatchSize<std::tuple<First, Rest...>> {
  static int64_t of(const std::tuple<First, Rest...>& t) { return batch_size_of(std::get<0>(t)); }
};

template <typename T, typename Alloc>
struct BatchSize<std::vector<T, Alloc>> {
  static int64_t of(const std::vector<T, Alloc>& v) { return static_cast<int64_t>(v.size()); }
};

template <typename K, typename V, typename C, typename Alloc>
struct BatchSize<std::map<K, V, C, Alloc>> {
  static int64_t of(const std::map<K, V, C, Alloc>& m) { return m.empty() ? -1 : batch_size_of(m.begin()->second); }
};

}  // namespace fulgor
