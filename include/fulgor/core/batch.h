#pragma once

#include <torch/data/example.h>
#include <torch/types.h>

#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fulgor/core/accelerator.h"

namespace fulgor {

/// How a batch of type T moves onto a device. fulgor provides it for tensors,
/// torch::data::Example, std::pair, std::tuple, std::vector and (unordered)
/// maps of these, and leaves numbers and strings where they are. Specialise it
/// for your own batch type:
///
///   template <> struct fulgor::BatchTransfer<MyBatch> {
///     static MyBatch move(MyBatch b, const fulgor::Accelerator& a, torch::Device d, bool non_blocking) {
///       b.image = fulgor::move_batch(std::move(b.image), a, d, non_blocking);
///       return b;
///     }
///   };
template <typename T, typename Enable = void>
struct BatchTransfer {
  static_assert(sizeof(T) == 0,
                "fulgor does not know how to move this batch type to a device: specialise "
                "fulgor::BatchTransfer<T> (see fulgor/core/batch.h)");
};

/// Moves every tensor in `batch` onto `device` through the accelerator.
template <typename T>
T move_batch(T batch, const Accelerator& accelerator, torch::Device device, bool non_blocking = false) {
  return BatchTransfer<T>::move(std::move(batch), accelerator, device, non_blocking);
}

template <>
struct BatchTransfer<torch::Tensor> {
  static torch::Tensor move(torch::Tensor t, const Accelerator& a, torch::Device d, bool non_blocking) {
    if (!t.defined() || t.device() == d) return t;
    return a.move_tensor(t, d, non_blocking);
  }
};

template <typename T>
struct BatchTransfer<T, std::enable_if_t<std::is_arithmetic_v<T> || std::is_same_v<T, std::string>>> {
  static T move(T value, const Accelerator&, torch::Device, bool) { return value; }
};

template <typename Data, typename Target>
struct BatchTransfer<torch::data::Example<Data, Target>> {
  static torch::data::Example<Data, Target> move(torch::data::Example<Data, Target> e, const Accelerator& a,
                                                 torch::Device d, bool non_blocking) {
    e.data = move_batch(std::move(e.data), a, d, non_blocking);
    e.target = move_batch(std::move(e.target), a, d, non_blocking);
    return e;
  }
};

template <typename Data>
struct BatchTransfer<torch::data::Example<Data, torch::data::example::NoTarget>> {
  using Example = torch::data::Example<Data, torch::data::example::NoTarget>;
  static Example move(Example e, const Accelerator& a, torch::Device d, bool non_blocking) {
    e.data = move_batch(std::move(e.data), a, d, non_blocking);
    return e;
  }
};

template <typename A, typename B>
struct BatchTransfer<std::pair<A, B>> {
  static std::pair<A, B> move(std::pair<A, B> p, const Accelerator& a, torch::Device d, bool non_blocking) {
    return {move_batch(std::move(p.first), a, d, non_blocking), move_batch(std::move(p.second), a, d, non_blocking)};
  }
};

template <typename... Ts>
struct BatchTransfer<std::tuple<Ts...>> {
  static std::tuple<Ts...> move(std::tuple<Ts...> t, const Accelerator& a, torch::Device d, bool non_blocking) {
    return std::apply(
        [&](auto&&... items) { return std::tuple<Ts...>(move_batch(std::move(items), a, d, non_blocking)...); },
        std::move(t));
  }
};

template <typename T, typename Alloc>
struct BatchTransfer<std::vector<T, Alloc>> {
  static std::vector<T, Alloc> move(std::vector<T, Alloc> v, const Accelerator& a, torch::Device d, bool non_blocking) {
    for (auto& item : v) item = move_batch(std::move(item), a, d, non_blocking);
    return v;
  }
};

namespace detail {
template <typename Map>
Map move_map_values(Map m, const Accelerator& a, torch::Device d, bool non_blocking) {
  for (auto& entry : m) entry.second = move_batch(std::move(entry.second), a, d, non_blocking);
  return m;
}
}  // namespace detail

template <typename K, typename V, typename C, typename Alloc>
struct BatchTransfer<std::map<K, V, C, Alloc>> {
  static std::map<K, V, C, Alloc> move(std::map<K, V, C, Alloc> m, const Accelerator& a, torch::Device d,
                                       bool non_blocking) {
    return detail::move_map_values(std::move(m), a, d, non_blocking);
  }
};

template <typename K, typename V, typename H, typename E, typename Alloc>
struct BatchTransfer<std::unordered_map<K, V, H, E, Alloc>> {
  static std::unordered_map<K, V, H, E, Alloc> move(std::unordered_map<K, V, H, E, Alloc> m, const Accelerator& a,
                                                    torch::Device d, bool non_blocking) {
    return detail::move_map_values(std::move(m), a, d, non_blocking);
  }
};

}  // namespace fulgor
