#pragma once

// The Trainer's state, shared by the parts of the Trainer in src/trainer/:
//   state.cpp                 beginning and ending a loop (Lightning's _run:
//                             accelerator, devices, strategy, hooks, callbacks)
//   fit_loop.cpp              the fit loop: epochs, the validation schedule,
//                             resuming, and the training batch
//                             (training_batch.h)
//   evaluation_loop.cpp       one loop for validate, test, predict and the
//                             sanity check
//   metric_store.cpp          log(), epoch aggregation, the loggers
//   checkpoint_connector.cpp  saving and restoring, "last" and "best", RNG
//   profiling.cpp             profiler = "simple": the actions' names
//   trainer.cpp               the Trainer's own members

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint_connector.h"
#include "evaluation_loop.h"
#include "fulgor/trainer.h"
#include "manual_optimization.h"
#include "metric_store.h"
#include "precision_plugin.h"
#include "profiling.h"

// Branches the per-step path rarely takes (Note [The per-step path] in fit_loop.cpp).
#if defined(__GNUC__)
#define FULGOR_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define FULGOR_UNLIKELY(x) (x)
#endif

namespace fulgor {
struct DistributedEnvironment;

namespace detail {

class DdpStrategy;

struct TrainerState {
  TrainerState(Trainer& owner, TrainerOptions opts);
  ~TrainerState();

  Trainer& trainer;
  TrainerOptions options;
  std::vector<std::shared_ptr<Callback>> callbacks;
  std::vector<std::shared_ptr<Logger>> loggers;
  std::unique_ptr<Accelerator> accelerator;
  // Strategy "ddp": made by the first loop, kept for the Trainer's others.
  std::unique_ptr<DdpStrategy> ddp;
  std::optional<torch::Device> device;
  ModuleBase* module = nullptr;
  // The data module of the loop running or last run (nullptr: it had none).
  DataModuleBase* datamodule = nullptr;
  OptimizerConfig optim;
  PrecisionPlugin precision;
  // Whether the fit running optimizes manually (the module's
  // automatic_optimization() when it began), and what the module steps with.
  bool manual = false;
  ManualOptimization manual_optimization{*this};

  // Progress.
  int64_t epoch = 0, global_step = 0, batches_in_epoch = 0, total_train_batches = 0;
  // Lightning's _batches_that_stepped under manual optimization, where a
  // batch may step several optimizers (global_step counts their steps):
  // the loggers' step label and log_every_n_steps count batches.
  int64_t manual_batches = 0;
  int64_t logging_step() const { return manual ? manual_batches : global_step; }
  bool epoch_finished = false;
  std::optional<int64_t> train_batches;
  int64_t max_epochs = -1;
  std::string stage, loop;
  bool sanity = false;
  bool should_stop = false;
  std::string stop_reason;
  // LibTorch's deterministic-algorithms setting (and its warn_only) from
  // before a loop with `deterministic` set it, put back when the loop ends.
  std::optional<std::pair<bool, bool>> deterministic_before;

  MetricStore metrics{*this};
  CheckpointConnector checkpoints{*this};
  EvaluationLoop evaluation{*this};

  // profiler = "simple"; null when off.
  std::unique_ptr<Profiling> profiling;

  // Note [Profiling at no cost]
  // Every hook goes through each_callback and call_module, and every loop
  // stage opens a ProfileScope on profile(name): with the profiler off that
  // is a null check, with no clock read, allocation or name built; hook
  // names are string literals, whose names are built once per loop.
  template <typename F>
  void each_callback(const char* hook, F&& f) {
    if (FULGOR_UNLIKELY(profiling != nullptr)) {
      for (auto& cb : callbacks) {
        ProfileScope timed(&profiling->callback_hook(*cb, hook));
        f(*cb);
      }
      return;
    }
    for (auto& cb : callbacks) f(*cb);
  }
  template <typename F>
  decltype(auto) call_module(const char* hook, F&& f) {
    ProfileScope timed(FULGOR_UNLIKELY(profiling != nullptr) ? &profiling->module_hook(*module, hook) : nullptr);
    return f();
  }
  // The action of a loop stage, a strategy call ("training_step",
  // "backward"), or nullptr when the profiler is off.
  SimpleProfiler::Action* profile(const char* stage_name) {
    return FULGOR_UNLIKELY(profiling != nullptr) ? &profiling->stage(stage_name) : nullptr;
  }
  SimpleProfiler::Action* profile_strategy(const char* hook) {
    return FULGOR_UNLIKELY(profiling != nullptr) ? &profiling->strategy_hook(ddp != nullptr, hook) : nullptr;
  }
  // Writes the profiler's report at the end of a loop that succeeded, as
  // Lightning's _call_teardown_hook does.
  void describe_profile(const std::string& name);

  // Lightning's _run, up to the loop: options, accelerator, devices and
  // strategy for the loop `name` ("fit", "validate", ...).
  void begin(const std::string& name);
  // Sets up the device and moves the module onto it; log() goes to `metrics`.
  void attach(ModuleBase& model);
  // Undoes begin and attach; runs also when a loop throws.
  void end();
  // Lightning's _attach_model_callbacks.
  void attach_model_callbacks(ModuleBase& model);
  // Lightning's _DataConnector.prepare_data, then _call_setup_hook; and
  // _call_teardown_hook.
  void setup_hooks(ModuleBase& model, const std::string& name);
  void teardown_hooks(ModuleBase& model, const std::string& name);
  // Lightning's _interrupt: the callbacks hear of the exception, and the
  // loggers are finalized as failed.
  void on_exception(ModuleBase& model, const std::exception& e);
  void configure_optimizers(ModuleBase& model);
  // The hyper-parameters the loggers get: the module's, and the data module's
  // (Lightning's _log_hyperparams).
  nlohmann::json logged_hparams(const ModuleBase& model) const;
  // Takes a loop's loader from the data module: throws ConfigError naming
  // `stage`'s loader when it has none.
  void open_loader(StepRunner& runner, Stage stage);
  // Under ddp, the stop every rank acts on (agree_on_stop in state.cpp).
  int agree_on_stop(int signal);

  // Batches an evaluation loop runs for stage `s` (nullopt: all).
  std::optional<int64_t> eval_limit(Stage s, const StepRunner& runner) const;
  static std::optional<int64_t> resolve_limit(const Limit& limit, const StepRunner& runner, const char* name);

 private:
  int64_t resolved_max_epochs() const;
  void start_ddp(const DistributedEnvironment& environment, torch::Device on);
};

}  // namespace detail
}  // namespace fulgor
