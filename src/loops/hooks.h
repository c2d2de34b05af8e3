#pragma once

// Lightning's trainer/call.py: the one place that calls the callbacks', the
// module's and the strategy's hooks, in Lightning's order, with the
// profiler's action names.

#include <memory>
#include <vector>

#include "fulgor/callback.h"
#include "fulgor/loops/step_runner.h"
#include "fulgor/module.h"
#include "loops/profiling.h"

// Branches the per-step path rarely takes (Note [The per-step path] in
// training_epoch_loop.cpp).
#if defined(__GNUC__)
#define FULGOR_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define FULGOR_UNLIKELY(x) (x)
#endif

namespace fulgor::detail {

class DdpStrategy;

// The batch-end hooks' view of the step `runner` just ran (Note [The hooks'
// batch] in fulgor/loops/step_runner.h).
inline BatchEnd batch_end(const StepRunner& runner, const torch::Tensor& outputs, int64_t batch_idx) {
  return BatchEnd{outputs, batch_idx, 0, runner.held_batch(), &runner.batch_type(), runner.batch_indices()};
}

// Note [Profiling at no cost]
// Every hook goes through Hooks, and every loop stage opens a ProfileScope
// on stage(name): with the profiler off that is a null check, with no clock
// read, allocation or name built; hook names are string literals, whose
// names are built once per loop.
class Hooks {
 public:
  // Which callbacks a call reaches: Lightning calls on_train_epoch_end on
  // the monitoring ones (Callback::monitors_metrics) after the module's.
  enum class Which { all, not_monitoring, monitoring };

  Hooks(Trainer& trainer, const std::vector<std::shared_ptr<Callback>>& callbacks, ModuleBase* const& module,
        const std::unique_ptr<Profiling>& profiling, const std::unique_ptr<DdpStrategy>& ddp)
      : trainer_(trainer), callbacks_(callbacks), module_(module), profiling_(profiling), ddp_(ddp) {}

  // Lightning's _call_callback_hooks: `f(callback)` for each callback, in order.
  template <typename F>
  void each_callback(const char* hook, F&& f, Which which = Which::all) {
    if (FULGOR_UNLIKELY(profiling_ != nullptr || which != Which::all)) {
      for (auto& cb : callbacks_) {
        if (which != Which::all && cb->monitors_metrics() != (which == Which::monitoring)) continue;
        ProfileScope timed(profiling_ ? &profiling_->callback_hook(*cb, hook) : nullptr);
        f(*cb);
      }
      return;
    }
    for (auto& cb : callbacks_) f(*cb);
  }
  // Lightning's _call_lightning_module_hook: returns what `f` returns.
  template <typename F>
  decltype(auto) module(const char* hook, F&& f) {
    ProfileScope timed(FULGOR_UNLIKELY(profiling_ != nullptr) ? &profiling_->module_hook(*module_, hook) : nullptr);
    return f();
  }
  class CallbackCalls;
  // The catalogue's hooks of every callback, given the hook's arguments after
  // the Trainer and the module: hooks.callbacks().on_before_backward(loss).
  // The module is the running one, or `model` before it is set.
  CallbackCalls callbacks();
  CallbackCalls callbacks(ModuleBase& model);

  // A hook without arguments of the callbacks, then of the module.
  void both(const char* hook, void (Callback::*callback)(Trainer&, ModuleBase&), void (ModuleBase::*own)()) {
    each_callback(hook, [&](Callback& cb) { (cb.*callback)(trainer_, *module_); });
    module(hook, [&] { ((*module_).*own)(); });
  }
  // The profiler's action of a strategy call ("training_step", "backward"),
  // as Lightning's _call_strategy_hook; nullptr when the profiler is off.
  SimpleProfiler::Action* strategy(const char* hook) {
    return FULGOR_UNLIKELY(profiling_ != nullptr) ? &profiling_->strategy_hook(ddp_ != nullptr, hook) : nullptr;
  }
  // The profiler's action of a loop stage ("run_training_batch").
  SimpleProfiler::Action* stage(const char* name) {
    return FULGOR_UNLIKELY(profiling_ != nullptr) ? &profiling_->stage(name) : nullptr;
  }

 private:
  Trainer& trainer_;
  const std::vector<std::shared_ptr<Callback>>& callbacks_;
  ModuleBase* const& module_;
  const std::unique_ptr<Profiling>& profiling_;
  const std::unique_ptr<DdpStrategy>& ddp_;
};

// One member per entry of fulgor/callback_hooks.def, named after the hook,
// calling it on every callback under the hook's name.
class Hooks::CallbackCalls {
 public:
  CallbackCalls(Hooks& hooks, ModuleBase& module) : h_(hooks), m_(module) {}

#define FULGOR_HOOK(name)                                                                     \
  void name(Which which = Which::all) {                                                       \
    h_.each_callback(#name, [&](Callback& cb) { cb.name(h_.trainer_, m_); }, which); \
  }
#define FULGOR_HOOK_WITH(name, Type) \
  void name(Type arg) { h_.each_callback(#name, [&](Callback& cb) { cb.name(h_.trainer_, m_, arg); }); }
#define FULGOR_BATCH_END(name, types, from_end) \
  void name(const BatchEnd& end) { h_.each_callback(#name, [&](Callback& cb) { cb.name(h_.trainer_, m_, end); }); }
#include "fulgor/callback_hooks.def"

 private:
  Hooks& h_;
  ModuleBase& m_;
};

inline Hooks::CallbackCalls Hooks::callbacks(ModuleBase& model) { return CallbackCalls(*this, model); }
inline Hooks::CallbackCalls Hooks::callbacks() { return callbacks(*module_); }

}  // namespace fulgor::detail
