#pragma once

// What the loops run with (goal: the loops see this, and nothing of the
// Trainer above them): the options and limits, the module and its
// optimizers, the accelerator and the strategy, the hook caller and where
// log() goes. The Trainer's state (src/trainer/state.h) is a LoopContext
// that owns the loops; the few things only the Trainer does (its checkpoints)
// the loops ask for through the virtual members.

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "fulgor/callback.h"
#include "fulgor/config/trainer_options.h"
#include "fulgor/core/accelerator.h"
#include "fulgor/loggers/logger.h"
#include "fulgor/loops/step_runner.h"
#include "fulgor/module.h"
#include "loops/hooks.h"
#include "loops/manual_optimization.h"
#include "loops/metric_store.h"
#include "loops/profiling.h"
#include "precision/precision_plugin.h"

namespace fulgor {
class Trainer;
}

namespace fulgor::detail {

class DdpStrategy;
class FitLoop;

// Lightning's RunningStage: the loop running now.
enum class RunningStage { none, training, sanity_checking, validating, testing, predicting };

// The options as the loops follow them: fast_dev_run and overfit_batches
// rewrite the limits, as Lightning's _init_debugging_flags does, and the
// epoch limits are resolved as its _parse_loop_limits.
struct LoopLimits {
  explicit LoopLimits(const TrainerOptions& o);

  int64_t max_epochs, max_steps, min_epochs;
  std::optional<int64_t> min_steps;
  int64_t num_sanity_val_steps;  // -1: all the validation batches
  Limit limit_train_batches, limit_val_batches, limit_test_batches, limit_predict_batches;
  Limit val_check_interval;
  std::optional<int64_t> check_val_every_n_epoch;
  bool overfit;  // overfit_batches is set: the loaders stop shuffling
};

struct LoopContext {
  // `owner` is what the hooks are given.
  LoopContext(Trainer& owner, TrainerOptions opts);
  virtual ~LoopContext();
  LoopContext(const LoopContext&) = delete;
  LoopContext& operator=(const LoopContext&) = delete;

  Trainer& trainer;
  const TrainerOptions options;
  // The tuner's sweeps (src/tuner/) run the fit loop under their own limits
  // for a while, and put these back.
  LoopLimits limits{options};
  // Lightning's trainer.accumulate_grad_batches: the options' value, which a
  // callback (GradientAccumulationScheduler) may change between epochs.
  int64_t accumulate_grad_batches = options.accumulate_grad_batches;
  std::vector<std::shared_ptr<Callback>> callbacks;
  std::vector<std::shared_ptr<Logger>> loggers;
  std::unique_ptr<Accelerator> accelerator;
  // Strategy "ddp": made by the first loop, kept for the Trainer's others.
  std::unique_ptr<DdpStrategy> ddp;
  // The device of the loop running or last run; empty before the first.
  std::optional<DeviceSetup> device_setup;
  ModuleBase* module = nullptr;
  // The data module of the loop running or last run (nullptr: it had none).
  DataModuleBase* datamodule = nullptr;
  OptimizerConfig optim;
  PrecisionPlugin precision;
  // Whether the fit running optimizes manually (the module's
  // automatic_optimization() when it began), and what the module steps with.
  bool manual = false;
  ManualOptimization manual_optimization{*this};

  // "fit", "validate", "test", "predict"; "" before any loop.
  std::string stage;
  RunningStage running = RunningStage::none;
  bool sanity_checking() const { return running == RunningStage::sanity_checking; }
  bool should_stop = false;
  std::string stop_reason;
  // The messages warn_once and info_once gave in this loop.
  std::set<std::string> said_once;

  // profiler = "simple"; null when off.
  std::unique_ptr<Profiling> profiling;
  Hooks hooks{trainer, callbacks, module, profiling, ddp};
  MetricStore metrics{*this};

  // The fit loop, whose epochs and steps the other loops, the optimizations
  // and log() count with.
  virtual FitLoop& fit() = 0;
  // The Trainer's checkpoints (its CheckpointConnector): saving one
  // synchronously, finishing an asynchronous write that has ended (which
  // throws its error), and the folder they go to.
  virtual void save_checkpoint(const std::string& path) = 0;
  virtual void poll_checkpoint_write() = 0;
  virtual std::string checkpoint_dir() const = 0;

  // Takes a loop's loader where a data module or the module makes it:
  // throws ConfigError naming the loader when there is none.
  void open_loader(StepRunner& runner, Stage stage);
  [[noreturn]] void no_loader(const StepRunner& runner, Stage stage) const;
  // Under ddp, the stop every rank acts on (agree_on_stop in context.cpp).
  int agree_on_stop(int signal);
  // Gives the loader of `runner` this rank's shard, `even` or not, as a loop
  // starts (Note [Distributed sampling] in context.cpp).
  void distribute(StepRunner& runner, bool even);
  // Warns where the loader tells that it has no batch.
  void warn_if_empty(const StepRunner& runner, Stage which) const;
  // Lightning's rank_zero_info and rank_zero_warn: a line on standard output
  // or standard error, from rank 0 only.
  void info(const std::string& message) const;
  void warn(const std::string& message) const;
  // Once per loop for each message, as Lightning's WarningCache.
  void warn_once(const std::string& message);
  void info_once(const std::string& message);
  bool is_global_zero() const;

  static std::optional<int64_t> resolve_limit(const Limit& limit, const StepRunner& runner, const char* name);
};

}  // namespace fulgor::detail
