#pragma once

#include "fulgor/core/export.h"

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <nlohmann/json.hpp>

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace fulgor {

namespace detail {

template <typename T, typename = void>
inline constexpr bool has_json_state = false;
template <typename T>
inline constexpr bool has_json_state<
    T, std::void_t<decltype(nlohmann::json(std::declval<const T&>().state_dict())),
                   decltype(std::declval<T&>().load_state_dict(std::declval<const nlohmann::json&>()))>> = true;
template <typename T, typename = void>
inline constexpr bool has_archive_state = false;
template <typename T>
inline constexpr bool has_archive_state<
    T, std::void_t<decltype(std::declval<const T&>().save(std::declval<torch::serialize::OutputArchive&>())),
                   decltype(std::declval<T&>().load(std::declval<torch::serialize::InputArchive&>()))>> = true;
template <typename T>
inline constexpr bool is_shared_ptr = false;
template <typename T>
inline constexpr bool is_shared_ptr<std::shared_ptr<T>> = true;
// A class FabricStateItem takes by its members, not by what it is.
template <typename T>
inline constexpr bool is_state_object =
    std::is_class_v<T> && !std::is_base_of_v<torch::nn::Module, T> && !std::is_base_of_v<torch::optim::Optimizer, T> &&
    !std::is_same_v<T, torch::Tensor> && !is_shared_ptr<T>;
template <typename T>
inline constexpr bool is_json_stateful = is_state_object<T>&& has_json_state<T>;
template <typename T>
inline constexpr bool is_archive_stateful = is_state_object<T>&& has_archive_state<T>;
template <typename T>
inline constexpr bool is_plain_value =
    !std::is_const_v<T> && (std::is_arithmetic_v<T> || std::is_same_v<T, std::string> ||
                            (is_state_object<T> && !has_json_state<T> && !has_archive_state<T> &&
                             std::is_constructible_v<nlohmann::json, const T&>));

}  // namespace detail

/// One named item of what Fabric::save writes and Fabric::load restores
/// (Lightning's `state` dict): a reference to the caller's object, which
/// load restores in place.
///
///   - a module (torch::nn::Module, a ModuleHolder such as torch::nn::Linear,
///     or a shared_ptr to one): its parameters and buffers by name;
///   - an optimizer (or a shared_ptr to one): its state, moved to the device
///     of its parameters on load;
///   - anything with `nlohmann::json state_dict() const` and
///     `void load_state_dict(const nlohmann::json&)` (a fulgor::LRScheduler),
///     or with `save(torch::serialize::OutputArchive&) const` and
///     `load(torch::serialize::InputArchive&)` (a fulgor::GradScaler);
///   - a torch::Tensor variable: replaced by the saved tensor, on the CPU;
///   - a plain value that nlohmann::json converts both ways (numbers, bool,
///     std::string, vectors and maps of them, nlohmann::json itself).
///
/// Requires: the referenced objects outlive the FabricState.
class FULGOR_API FabricStateItem {
 public:
  enum class Kind { module, optimizer, archive, json_state, tensor, value };

  FabricStateItem(torch::nn::Module& module) : kind_(Kind::module), module_(&module) {}
  template <typename M>
  FabricStateItem(torch::nn::ModuleHolder<M>& holder) : FabricStateItem(static_cast<torch::nn::Module&>(*holder)) {}
  FabricStateItem(torch::optim::Optimizer& optimizer) : kind_(Kind::optimizer), optimizer_(&optimizer) {}
  template <typename T, typename = std::enable_if_t<std::is_base_of_v<torch::nn::Module, T> ||
                                                    std::is_base_of_v<torch::optim::Optimizer, T>>>
  FabricStateItem(const std::shared_ptr<T>& object) : FabricStateItem(*object) {}
  FabricStateItem(torch::Tensor& tensor) : kind_(Kind::tensor), tensor_(&tensor) {}
  template <typename T, std::enable_if_t<detail::is_json_stateful<T>, int> = 0>
  FabricStateItem(T& object)
      : kind_(Kind::json_state),
        to_json_([&object] { return nlohmann::json(object.state_dict()); }),
        from_json_([&object](const nlohmann::json& state) { object.load_state_dict(state); }) {}
  template <typename T, std::enable_if_t<detail::is_archive_stateful<T> && !detail::is_json_stateful<T>, int> = 0>
  FabricStateItem(T& object)
      : kind_(Kind::archive),
        save_([&object](torch::serialize::OutputArchive& archive) { object.save(archive); }),
        load_([&object](torch::serialize::InputArchive& archive) { object.load(archive); }) {}
  template <typename T, std::enable_if_t<detail::is_plain_value<T>, int> = 0>
  FabricStateItem(T& value)
      : kind_(Kind::value),
        to_json_([&value] { return nlohmann::json(value); }),
        from_json_([&value](const nlohmann::json& saved) { value = saved.get<T>(); }) {}

  Kind kind() const { return kind_; }
  torch::nn::Module* module() const { return module_; }
  torch::optim::Optimizer* optimizer() const { return optimizer_; }
  torch::Tensor* tensor() const { return tensor_; }
  /// For json_state and value items.
  nlohmann::json to_json() const { return to_json_(); }
  void from_json(const nlohmann::json& saved) const { from_json_(saved); }
  /// For archive items.
  void save(torch::serialize::OutputArchive& archive) const { save_(archive); }
  void load(torch::serialize::InputArchive& archive) const { load_(archive); }

 private:
  Kind kind_;
  torch::nn::Module* module_ = nullptr;
  torch::optim::Optimizer* optimizer_ = nullptr;
  torch::Tensor* tensor_ = nullptr;
  std::function<nlohmann::json()> to_json_;
  std::function<void(const nlohmann::json&)> from_json_;
  std::function<void(torch::serialize::OutputArchive&)> save_;
  std::function<void(torch::serialize::InputArchive&)> load_;
};

/// The named state of Fabric::save and Fabric::load, in the caller's order:
///   fulgor::FabricState state{{"model", model}, {"optimizer", optimizer}, {"step", step}};
/// Names are letters, digits, '_' and '-', other than "meta".
using FabricState = std::vector<std::pair<std::string, FabricStateItem>>;

}  // namespace fulgor
