#pragma once

// The Trainer's state: the loops' context (src/loops/context.h) and the loops
// themselves. The Trainer's parts in src/trainer/:
//   state.cpp                 beginning and ending a loop (Lightning's _run:
//                             accelerator, devices, strategy, setup hooks)
//   run.cpp                   fit, validate, test and predict, in Lightning's
//                             order around the loops of src/loops/
//   checkpoint_connector.cpp  saving and restoring, "last" and "best"
//   trainer.cpp               the Trainer's own members

#include <nlohmann/json.hpp>

#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "fulgor/trainer.h"
#include "loops/context.h"
#include "loops/evaluation_loop.h"
#include "loops/fit_loop.h"
#include "loops/prediction_loop.h"
#include "trainer/checkpoint_connector.h"

namespace fulgor {
struct DistributedEnvironment;

namespace detail {

// Thrown by a finder the Tuner added, once its sweep is over, to end the fit
// there (Lightning's _TunerExitException): the fit tears down as one that
// succeeded. Not a std::exception, so that nothing takes it for a failure.
struct TunerExit {};

// The Trainer's state: the loops' context, and the loops themselves, which
// it owns; what the Trainer does around the loops.
struct TrainerState final : LoopContext {
  TrainerState(Trainer& owner, TrainerOptions opts);
  ~TrainerState() override;

  // LibTorch's deterministic-algorithms setting (and its warn_only) from
  // before a loop with `deterministic` set it, put back when the loop ends.
  std::optional<std::pair<bool, bool>> deterministic_before;
  bool barebones_announced = false;

  CheckpointConnector checkpoints{*this};

  FitLoop fit_loop{*this};
  EvaluationLoop validate_loop{*this, Stage::validate}, test_loop{*this, Stage::test};
  PredictionLoop predict_loop{*this};
  // The evaluation or prediction loop running now; nullptr outside them.
  const InferenceLoop* running_inference() const;

  FitLoop& fit() override { return fit_loop; }
  void save_checkpoint(const std::string& path) override { checkpoints.save(path); }
  void poll_checkpoint_write() override { checkpoints.poll(); }
  std::string checkpoint_dir() const override;

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
  /// Synchronizes (and shards) `model` and its optimizers under the ddp strategy.
  void attach_ddp(ModuleBase& model);

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
