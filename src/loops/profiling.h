#pragma once

// The loops' side of profiler = "simple": which action a hook, a strategy
// call or a loop stage records into, named as Lightning names it, and a scope
// that times one call. Note [Profiling at no cost] in src/loops/hooks.h says
// how the loops use them.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "fulgor/callback.h"
#include "fulgor/module.h"
#include "fulgor/profiler.h"

namespace fulgor::detail {

class Profiling {
 public:
  using Action = SimpleProfiler::Action;

  explicit Profiling(std::unique_ptr<SimpleProfiler> profiler) : profiler_(std::move(profiler)) {}

  const SimpleProfiler& profiler() const { return *profiler_; }
  SimpleProfiler& profiler() { return *profiler_; }

  // "[Callback]<state_key>.<hook>", as Lightning's _call_callback_hooks.
  Action& callback_hook(const Callback& cb, const char* hook);
  // "[LightningModule]<class>.<hook>", as Lightning's _call_lightning_module_hook.
  Action& module_hook(const ModuleBase& module, const char* hook);
  // "[Strategy]<SingleDeviceStrategy or DDPStrategy>.<hook>", as Lightning's _call_strategy_hook.
  Action& strategy_hook(bool ddp, const char* hook);
  // A loop stage named as Lightning's loops name it ("run_training_batch").
  Action& stage(const char* name);
  // Forgets which owner has which name, when a loop begins: a callback or a
  // module of a later loop may live at the address of one that is gone.
  void forget_owners() { slots_.clear(); }

 private:
  // The name of an (owner, hook) pair is built once; hook names are string
  // literals, so their addresses identify them.
  using Key = std::pair<const void*, const char*>;
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<const void*>()(k.first) * 31 + std::hash<const void*>()(k.second);
    }
  };
  template <typename MakeName>
  Action& cached(const void* owner, const char* hook, MakeName&& make_name) {
    auto it = slots_.find(Key(owner, hook));
    if (it != slots_.end()) return *it->second;
    Action& a = profiler_->action(make_name());
    slots_.emplace(Key(owner, hook), &a);
    return a;
  }

  std::unique_ptr<SimpleProfiler> profiler_;
  std::unordered_map<Key, Action*, KeyHash> slots_;
};

// Times one call into `action`; does nothing for a null action (profiler off).
class ProfileScope {
 public:
  explicit ProfileScope(SimpleProfiler::Action* action) : action_(action) {
    if (action_) start_ = SimpleProfiler::Clock::now();
  }
  ~ProfileScope() {
    if (action_) {
      ++action_->calls;
      action_->total_seconds += std::chrono::duration<double>(SimpleProfiler::Clock::now() - start_).count();
    }
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  SimpleProfiler::Action* action_;
  SimpleProfiler::Clock::time_point start_;
};

}  // namespace fulgor::detail
