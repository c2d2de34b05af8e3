#pragma once

#include <any>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <utility>

#include "fulgor/core/error.h"

namespace fulgor {

namespace detail {
// The std::function a hook is kept as: its arguments decayed, so that
// Fabric::call finds it from the types of the values it passes.
template <typename F>
struct HookFunction : HookFunction<decltype(&F::operator())> {};
template <typename R, typename... Args>
struct HookFunction<R (*)(Args...)> {
  using type = std::function<void(std::decay_t<Args>...)>;
};
template <typename C, typename R, typename... Args>
struct HookFunction<R (C::*)(Args...)> : HookFunction<R (*)(Args...)> {};
template <typename C, typename R, typename... Args>
struct HookFunction<R (C::*)(Args...) const> : HookFunction<R (*)(Args...)> {};
}  // namespace detail

/// A callback of a Fabric loop (Lightning Fabric's `callbacks`, which are any
/// objects whose methods `fabric.call(name, ...)` names). A C++ object cannot
/// be asked for a method by name, so a callback registers its hooks by name:
///
///   struct EpochPrinter : fulgor::FabricCallback {
///     EpochPrinter() {
///       hook("on_train_epoch_end", [](int64_t epoch, double loss) { std::cout << epoch << " " << loss << "\n"; });
///     }
///   };
///   fulgor::Fabric fabric({.callbacks = {std::make_shared<EpochPrinter>()}});
///   fabric.call("on_train_epoch_end", epoch, loss);  // an int64_t and a double
///
/// Contract: a hook is any callable (a lambda, a function pointer) whose
/// arguments are taken by value or const reference. Fabric::call runs the hook
/// of that name on each callback that has one, in the callbacks' order, with
/// the values it is given, whose types must be the hook's (an int where the
/// hook takes an int64_t is refused: ConfigError naming the hook).
class FabricCallback {
 public:
  virtual ~FabricCallback() = default;

  /// Whether this callback has a hook `name`.
  bool has_hook(const std::string& name) const { return hooks_.count(name) != 0; }

  /// Runs the hook `name` with `args`, if there is one.
  template <typename... Args>
  void call(const std::string& name, const Args&... args) const {
    const auto found = hooks_.find(name);
    if (found == hooks_.end()) return;
    const auto* hook = std::any_cast<std::function<void(Args...)>>(&found->second);
    if (hook == nullptr)
      throw ConfigError("fabric.call('" + name +
                        "'): the callback's hook of that name takes other argument types than the ones passed; pass "
                        "values of exactly the types its parameters have");
    (*hook)(args...);
  }

 protected:
  /// Registers `function` as the hook `name`, replacing one of that name.
  template <typename F>
  void hook(const std::string& name, F function) {
    hooks_[name] = typename detail::HookFunction<std::decay_t<F>>::type(std::move(function));
  }

 private:
  std::map<std::string, std::any> hooks_;
};

}  // namespace fulgor
