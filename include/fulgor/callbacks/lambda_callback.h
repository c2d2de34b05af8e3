#pragma once

#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include "fulgor/callback.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// A batch-end function of LambdaHooks. It takes either form of the hook
/// (Callback's): `(Trainer&, ModuleBase&, const BatchEnd&)`, with the batch
/// and the step's outputs, or the shorter `Short` one; a function callable
/// as both is given the BatchEnd.
template <typename Short>
class BatchEndFunction {
  using Full = void(Trainer&, ModuleBase&, const BatchEnd&);

 public:
  BatchEndFunction() = default;
  template <typename F, typename = std::enable_if_t<!std::is_same_v<F, BatchEndFunction> &&
                                                    (std::is_invocable_v<F&, Trainer&, ModuleBase&, const BatchEnd&> ||
                                                     std::is_constructible_v<std::function<Short>, F>)>>
  BatchEndFunction(F f) {  // NOLINT(google-explicit-constructor): assigned like a std::function
    if constexpr (std::is_invocable_v<F&, Trainer&, ModuleBase&, const BatchEnd&>) {
      f_ = std::move(f);
    } else {
      f_ = [g = std::function<Short>(std::move(f))](Trainer& t, ModuleBase& m, const BatchEnd& end) {
        if constexpr (std::is_invocable_v<std::function<Short>&, Trainer&, ModuleBase&, int64_t>)
          g(t, m, end.batch_idx);
        else
          g(t, m, end.outputs, end.batch_idx);
      };
    }
  }
  explicit operator bool() const { return static_cast<bool>(f_); }
  void operator()(Trainer& trainer, ModuleBase& module, const BatchEnd& end) const { f_(trainer, module, end); }

 private:
  std::function<Full> f_;
};

/// The functions a LambdaCallback calls: one per Callback hook, with the
/// hook's arguments. Those left empty do nothing.
struct FULGOR_API LambdaHooks {
#define FULGOR_HOOK(name) std::function<void(Trainer&, ModuleBase&)> name;
#define FULGOR_HOOK_WITH(name, Type) std::function<void(Trainer&, ModuleBase&, Type)> name;
#define FULGOR_BATCH_END(name, types, from_end) \
  BatchEndFunction<void(Trainer&, ModuleBase&, FULGOR_HOOK_UNPAREN types)> name;
#define FULGOR_HOOK_UNPAREN(...) __VA_ARGS__
#include "fulgor/callback_hooks.def"
#undef FULGOR_HOOK_UNPAREN
};

/// A callback made of functions (Lightning's LambdaCallback): any hook as a
/// lambda, for a quick print or check without a class.
///
/// Contract: each hook calls its function in LambdaHooks when one is set, at
/// the hook's place in the Trainer's order, and does nothing otherwise. It
/// keeps no state. In C++20: `LambdaCallback({.on_train_epoch_end = ...})`.
class FULGOR_API LambdaCallback : public Callback {
 public:
  explicit LambdaCallback(LambdaHooks hooks) : hooks_(std::move(hooks)) {}

#define FULGOR_HOOK(name) void name(Trainer& trainer, ModuleBase& module) override;
#define FULGOR_HOOK_WITH(name, Type) void name(Trainer& trainer, ModuleBase& module, Type arg) override;
#define FULGOR_BATCH_END(name, types, from_end) \
  void name(Trainer& trainer, ModuleBase& module, const BatchEnd& end) override;
#include "fulgor/callback_hooks.def"

 private:
  LambdaHooks hooks_;
};

}  // namespace fulgor
