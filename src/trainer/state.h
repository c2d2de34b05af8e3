#pragma once

// The Trainer's state: what a loop runs with (options, accelerator, module,
// callbacks, loggers, optimizers), the loops themselves, and the parts they
// share. The Trainer's parts in src/trainer/:
//   state.cpp                 beginning and ending a loop (Lightning's _run:
//                             accelerator, devices, strategy, setup hooks)
//   run.cpp                   fit, validate, test and predict, in Lightning's
//                             order around the loops of src/loops/
//   metric_store.cpp          log(), epoch aggregation, the loggers
//   checkpoint_connector.cpp  saving and restoring, "last" and "best", RNG
//   trainer.cpp               the Trainer's own members

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint_connector.h"
#include "fulgor/trainer.h"
#include "loops/hooks.h"
#include "loops/fit_loop.h"
#include "loops/manual_optimization.h"
#include "loops/prediction_loop.h"
#include "metric_store.h"
#include "precision/trainer_precision.h"
#include "loops/profiling.h"

namespace fulgor {
struct DistributedEnvironment;

namespace detail {

class DdpStrategy;

// Thrown by a finder the Tuner added, once its sweep is over, to end the fit
// there (Lightning's _TunerExitException): the fit tears down as one that
// succeeded. Not a std::exception, so that nothing takes it for a failure.
struct TunerExit {};

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

struct TrainerState {
  TrainerState(Trainer& owner, TrainerOptions opts);
  ~TrainerState();

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
  TrainerPrecision precision;
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
  // LibTorch's deterministic-algorithms setting (and its warn_only) from
  // before a loop with `deterministic` set it, put back when the loop ends.
  std::optional<std::pair<bool, bool>> deterministic_before;
  // The messages warn_once and info_once gave in this loop.
  std::set<std::string> said_once;
  bool barebones_announced = false;

  // profiler = "simple"; null when off.
  std::unique_ptr<Profiling> profiling;
  Hooks hooks{trainer, callbacks, module, profiling, ddp};
  MetricStore metrics{*this};
  CheckpointConnector checkpoints{*this};

  FitLoop fit_loop{*this};
  EvaluationLoop validate_loop{*this, Stage::validate}, test_loop{*this, Stage::test};
  PredictionLoop predict_loop{*this};
  // The evaluation or prediction loop running now; nullptr outside them.
  const InferenceLoop* running_inference() const;

  // Writes the profiler's report at the end of a loop that succeeded, as
  // Lightning's _call_teardown_hook does.
  void describe_profile();

  // Lightning's _run, up to the loop: options, accelerator, devices and
  // strategy for the loop `name` ("fit", "validate", ...).
  void begin(const std::string& name);
  // Lightning's _run from the setup of the device to configure_model: moves
  // the module onto the device, merges the module's callbacks, prepares the
  // data and calls the setup hooks. log() goes to `metrics`.
  void launch(ModuleBase& model);
  // Undoes begin and launch; runs also when a loop throws.
  void end();
  // Lightning's _call_teardown_hook, the loggers finalized with `status`
  // and the profiler's report.
  void finish(ModuleBase& model, const std::string& status);
  // Lightning's _interrupt: the callbacks hear of the exception, and the
  // loggers are finalized as failed.
  void on_exception(ModuleBase& model, const std::exception& e);
  void configure_optimizers(ModuleBase& model);
  // The hyper-parameters the loggers get: the module's, and the data module's
  // (Lightning's _log_hyperparams).
  nlohmann::json logged_hparams(const ModuleBase& model) const;
  // Takes a loop's loader where a data module or the module makes it:
  // throws ConfigError naming the loader when there is none.
  void open_loader(StepRunner& runner, Stage stage);
  [[noreturn]] void no_loader(const StepRunner& runner, Stage stage) const;
  // Under ddp, the stop every rank acts on (agree_on_stop in state.cpp).
  int agree_on_stop(int signal);
  // Gives the loader of `runner` this rank's shard, `even` or not, as a loop
  // starts (Note [Distributed sampling] in state.cpp).
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

  static std::optional<int64_t> resolve_limit(const Limit& limit, const StepRunner& runner, const char* name);

 private:
  void attach_model_callbacks(ModuleBase& model);
  void setup_hooks(ModuleBase& model);
  void configure_model(ModuleBase& model);
  void place_module(ModuleBase& model);
  void set_benchmark();
  void announce_barebones();
  void start_ddp(const DistributedEnvironment& environment, const DeviceSetup& setup);
};

}  // namespace detail
}  // namespace fulgor
