#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fulgor/callback.h"
#include "fulgor/config/trainer_options.h"
#include "fulgor/core/accelerator.h"
#include "fulgor/core/error.h"
#include "fulgor/core/export.h"
#include "fulgor/data/data_loader.h"
#include "fulgor/data_module.h"
#include "fulgor/loops/fit_result.h"
#include "fulgor/loops/step_runner.h"
#include "fulgor/loggers/logger.h"
#include "fulgor/module.h"
#include "fulgor/profiler.h"

namespace fulgor {

class ModelCheckpoint;

struct FitOptions {
  /// A checkpoint to resume from: a path, "last" or "best" (the
  /// ModelCheckpoint's best_model_path). Empty: start fresh. "last" is the
  /// most recently modified of the last checkpoints (ModelCheckpoint's
  /// last*.ckpt, OnExceptionCheckpoint's file), else of the checkpoint
  /// folder's .ckpt files, never a save's temporary; with none, a warning
  /// and a fresh start, as in Lightning (see docs/training.md). A path may
  /// also name a file Python's torch.save wrote, told from its content: a
  /// Lightning .ckpt or a {"model": ..., "optimizer": ...} checkpoint, whose
  /// weights, torch.optim states (SGD, Adam, AdamW), torch schedulers'
  /// states and Lightning loop counters the fit continues from (Note
  /// [Resuming a Python run] in src/interop/python_checkpoint.cpp).
  std::string ckpt_path;
};

struct EvalOptions {
  /// A checkpoint whose weights to evaluate (a path, "last" or "best", as
  /// FitOptions::ckpt_path; "last" with none evaluates the module as it is).
  std::string ckpt_path;
};

namespace detail {
struct TrainerState;
struct TrainerAccess;
// Keeps the loader overloads of the Trainer's loops from taking a data
// module or the options: `trainer.fit(model, datamodule, options)` with a
// named FitOptions picks the data module's overload.
template <typename L>
using LoaderArgument = std::enable_if_t<!std::is_base_of_v<DataModuleBase, L> && !std::is_same_v<L, FitOptions> &&
                                        !std::is_same_v<L, EvalOptions>>;
}  // namespace detail

/// PyTorch Lightning's Trainer: runs a module's training, validation, test and
/// predict loops on any registered accelerator, with callbacks, loggers,
/// checkpoints and exact resume.
///
///   fulgor::Trainer trainer({.accelerator = "auto", .max_epochs = 5});
///   trainer.fit(model, train_loader, val_loader);
///   auto metrics = trainer.test(model, test_loader);
///
/// Loaders are any LibTorch data loader (or std::unique_ptr to one), or any
/// object with begin()/end() yielding the module's batch type; the optional
/// members the Trainer uses where a loader has them (size, set_epoch,
/// disable_shuffle, batches_on, bind_device, pin_memory) are described in
/// fulgor/data/loader_protocol.h.
///
/// Contract:
///   - Options are checked when a loop starts; bad values throw ConfigError,
///     as does a configure_optimizers returning more than one optimizer to a
///     module that optimizes automatically (manual optimization steps several:
///     ModuleBase::set_automatic_optimization).
///   - The module is moved onto the accelerator's device and stays there; a
///     "-true" precision other than 32 converts it there (docs/precision.md).
///   - Each loop calls Accelerator::teardown when it ends, also on exceptions
///     (which are rethrown after callbacks' on_exception).
///   - During fit, a first SIGINT or SIGTERM lets the current batch finish,
///     saves `last.ckpt` in checkpoint_dir() and returns StopReason::signal; a
///     second one terminates the process at once.
///   - Resuming from a checkpoint gives bit-identical results to an
///     uninterrupted run on the same accelerator when the loader's order
///     depends only on LibTorch's CPU generator (RandomSampler does) or on
///     the epoch number given to a loader's set_epoch(int64_t) member, which
///     the Trainer calls before each training epoch (TensorLoader), except
///     that gradients of an unfinished accumulate_grad_batches window are not
///     saved.
///   - strategy "ddp" (or "auto" under a launcher with WORLD_SIZE > 1) runs one
///     process per device with gradients averaged over the processes; see
///     docs/distributed.md for what it adds (sync_dist, rank-0-only output).
class FULGOR_API Trainer {
 public:
  explicit Trainer(TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  template <typename Batch, typename TrainLoader, typename ValLoader,
            typename = detail::LoaderArgument<std::remove_const_t<TrainLoader>>,
            typename = detail::LoaderArgument<std::remove_const_t<ValLoader>>>
  FitResult fit(BasicModule<Batch>& model, TrainLoader& train_loader, ValLoader& val_loader,
                const FitOptions& options = {}) {
    auto train = detail::make_runner(model, train_loader);
    auto val = detail::make_runner(model, val_loader);
    return run_fit(model, train, &val, options);
  }
  template <typename Batch, typename TrainLoader,
            typename = detail::LoaderArgument<std::remove_const_t<TrainLoader>>>
  FitResult fit(BasicModule<Batch>& model, TrainLoader& train_loader, const FitOptions& options = {}) {
    auto train = detail::make_runner(model, train_loader);
    return run_fit(model, train, nullptr, options);
  }
  /// Fits with the loaders of `datamodule` (its val_loader, when it has one,
  /// validates), calling its hooks (fulgor/data_module.h).
  template <typename Batch>
  FitResult fit(BasicModule<Batch>& model, BasicDataModule<Batch>& datamodule, const FitOptions& options = {}) {
    detail::DataModuleRunner<Batch> train(model, datamodule, detail::Stage::train);
    detail::DataModuleRunner<Batch> val(model, datamodule, detail::Stage::validate);
    return run_fit(model, train, &val, options, &datamodule);
  }
  /// Fits with the module's own loaders (its train_loader(), and its
  /// val_loader() to validate), as Lightning's fit(model) with its
  /// train_dataloader().
  template <typename Batch>
  FitResult fit(BasicModule<Batch>& model, const FitOptions& options = {}) {
    detail::ModuleLoaderRunner<Batch> train(model, model, detail::Stage::train);
    detail::ModuleLoaderRunner<Batch> val(model, model, detail::Stage::validate);
    return run_fit(model, train, &val, options);
  }

  /// Runs the validation loop; returns the epoch-level metrics it logged.
  template <typename Batch, typename Loader, typename = std::enable_if_t<!std::is_same_v<Loader, EvalOptions>>>
  std::map<std::string, double> validate(BasicModule<Batch>& model, Loader& loader, const EvalOptions& options = {}) {
    return evaluate(detail::Stage::validate, model, loader, options);
  }
  /// Runs the test loop; returns the epoch-level metrics it logged.
  template <typename Batch, typename Loader, typename = std::enable_if_t<!std::is_same_v<Loader, EvalOptions>>>
  std::map<std::string, double> test(BasicModule<Batch>& model, Loader& loader, const EvalOptions& options = {}) {
    return evaluate(detail::Stage::test, model, loader, options);
  }
  /// Runs predict_step over the loader; returns its outputs in order.
  template <typename Batch, typename Loader, typename = std::enable_if_t<!std::is_same_v<Loader, EvalOptions>>>
  std::vector<torch::Tensor> predict(BasicModule<Batch>& model, Loader& loader, const EvalOptions& options = {}) {
    std::vector<torch::Tensor> outputs;
    evaluate(detail::Stage::predict, model, loader, options, &outputs);
    return outputs;
  }
  /// The same loops on the module's own val_loader(), test_loader() and
  /// predict_loader().
  template <typename Batch>
  std::map<std::string, double> validate(BasicModule<Batch>& model, const EvalOptions& options = {}) {
    return evaluate(detail::Stage::validate, model, model, options);
  }
  template <typename Batch>
  std::map<std::string, double> test(BasicModule<Batch>& model, const EvalOptions& options = {}) {
    return evaluate(detail::Stage::test, model, model, options);
  }
  template <typename Batch>
  std::vector<torch::Tensor> predict(BasicModule<Batch>& model, const EvalOptions& options = {}) {
    std::vector<torch::Tensor> outputs;
    evaluate(detail::Stage::predict, model, model, options, &outputs);
    return outputs;
  }

  // ---- State, for hooks and after a loop -----------------------------------
  const TrainerOptions& options() const;
  /// The epoch being run (0-based), or the number completed after fit.
  int64_t current_epoch() const;
  /// Optimizer steps taken.
  int64_t global_step() const;
  /// Training batches finished in the current epoch.
  int64_t batches_in_epoch() const;
  /// Training batches per epoch after limits (nullopt: the loader does not tell).
  std::optional<int64_t> num_training_batches() const;
  /// Batches the current evaluation loop will run (nullopt: unknown).
  std::optional<int64_t> num_eval_batches() const;
  /// Batches a validation run of fit (or of validate) goes through, after
  /// limits; known once the loop has set up its loader, which fit does before
  /// on_train_start when its first epoch validates (nullopt: not set up, or
  /// the loader does not tell its length).
  std::optional<int64_t> num_val_batches() const;

  // ---- The options as the loops follow them (Lightning's Trainer properties):
  // fast_dev_run and overfit_batches rewrite the limits, and the epoch
  // limits are resolved.
  /// The epoch limit in force (-1: none).
  int64_t max_epochs() const;
  /// The step limit in force (-1: none): fast_dev_run's count under it.
  int64_t max_steps() const;
  /// The epochs a stop waits for (1 when only min_steps is set).
  int64_t min_epochs() const;
  /// Validation batches of the sanity check (-1: all; 0 under fast_dev_run).
  int64_t num_sanity_val_steps() const;
  /// Epochs between validations (nullopt: validation follows
  /// val_check_interval across epochs); 1 under fast_dev_run.
  std::optional<int64_t> check_val_every_n_epoch() const;
  /// The epochs between the loaders' reloads (0: once per fit).
  int64_t reload_dataloaders_every_n_epochs() const;
  /// The machines of the job (the option, checked against the launcher).
  int64_t num_nodes() const;
  /// Whether the Trainer runs in barebones mode.
  bool barebones() const;
  /// Training batches between validations, once fit has set up its loader
  /// (nullopt: before, or once per epoch of a loader without a length).
  std::optional<int64_t> val_check_batch() const;
  const Limit& limit_train_batches() const;
  const Limit& limit_val_batches() const;
  const Limit& limit_test_batches() const;
  const Limit& limit_predict_batches() const;
  /// "fit", "validate", "test", "predict" or "" between loops.
  std::string stage() const;
  /// The loop running now: "train", "validate", "test", "predict", "sanity_check" or "".
  std::string running_loop() const;
  bool sanity_checking() const;

  /// Asks the loops to stop after the current batch; training first completes
  /// min_epochs epochs.
  void request_stop(std::string reason);
  /// Batches whose gradients each optimizer step accumulates: the option
  /// accumulate_grad_batches until a callback sets another (between epochs,
  /// as GradientAccumulationScheduler does); ConfigError below 1.
  int64_t accumulate_grad_batches() const;
  void set_accumulate_grad_batches(int64_t batches);
  bool should_stop() const;
  const std::string& stop_reason() const;
  /// Whether the training batch being run sends its step values to the
  /// loggers (Lightning's rule): a batch that steps the optimizer does when
  /// that step is a multiple of log_every_n_steps or a stop has been
  /// requested. Decided as the batch begins; true outside training batches.
  bool logs_due() const;

  /// Every metric logged, for callbacks (monitors): step values while an epoch
  /// runs, epoch aggregates once it ends.
  const std::map<std::string, double>& callback_metrics() const;
  /// The metrics last sent to the loggers.
  const std::map<std::string, double>& logged_metrics() const;
  /// The metrics logged with prog_bar.
  const std::map<std::string, double>& progress_bar_metrics() const;
  /// Sends metrics to the loggers now (and into logged_metrics); for callbacks.
  void log_metrics(const std::map<std::string, double>& metrics);

  const std::vector<std::shared_ptr<Callback>>& callbacks() const;
  const std::vector<std::shared_ptr<Logger>>& loggers() const;
  /// The data module of the current or last loop; nullptr when it had none.
  DataModuleBase* datamodule() const;
  /// The first ModelCheckpoint among the callbacks, or nullptr.
  ModelCheckpoint* checkpoint_callback() const;
  const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers() const;
  const std::vector<SchedulerConfig>& lr_schedulers() const;
  /// The accelerator and device of the current or last loop; throws Error before any.
  const Accelerator& accelerator() const;
  torch::Device device() const;
  /// The precision of the current or last loop ("32-true" before any).
  const Precision& precision() const;
  /// The "16-mixed" loss scaler; nullptr for the other precisions.
  const GradScaler* grad_scaler() const;
  /// This process's rank in a "ddp" job (0 otherwise), the job's process
  /// count (1 otherwise), and whether this is rank 0, which alone shows the
  /// progress bar, writes logs and checkpoints. Known once a loop has begun.
  int64_t global_rank() const;
  int64_t world_size() const;
  bool is_global_zero() const;
  /// Under strategy "ddp", whether `decision` holds on every rank (all) or on
  /// any rank (!all); elsewhere `decision`. For callbacks whose decision leads
  /// to a collective, such as saving a checkpoint: every rank must call it at
  /// the same point, and then acts on the same answer (Lightning's
  /// strategy.reduce_boolean_decision).
  bool reduce_boolean_decision(bool decision, bool all = true);
  /// default_root_dir, or "." when empty.
  std::string default_root_dir() const;
  /// Where checkpoints go: the ModelCheckpoint's dirpath, else default_root_dir/checkpoints.
  std::string checkpoint_dir() const;
  /// The first logger's log_dir, else default_root_dir.
  std::string log_dir() const;

  /// The profiler of `profiler = "simple"`, with what the loops recorded so
  /// far; nullptr when the profiler is off.
  const SimpleProfiler* profiler() const;

  /// Saves the state of the module being (or last) fitted to `path`, atomically.
  /// Under strategy "ddp" every rank calls it: rank 0 writes the file, and
  /// the call returns on every rank once the file is complete.
  void save_checkpoint(const std::string& path);
  /// Saves as save_checkpoint, but with TrainerOptions::async_checkpointing
  /// returns once the state is copied to host memory and writes the file in
  /// the background (ModelCheckpoint's saves). `on_written` runs on the
  /// calling thread once the file is on disk: at a later training batch, at
  /// the next save or when the loop ends. A failed write throws
  /// CheckpointError there. One write is in flight at most: a save waits for
  /// the previous one first. Every end of fit (its return, a signal's stop,
  /// an exception) waits for the write in flight. Without
  /// async_checkpointing it is save_checkpoint followed by `on_written`.
  void save_checkpoint_async(const std::string& path, std::function<void()> on_written = {});
  /// Waits until the save that save_checkpoint_async started, if any, is on
  /// disk, runs its `on_written`, or throws its CheckpointError. Under ddp
  /// every rank calls it, and it returns once rank 0's file is complete.
  void wait_for_checkpoint();

 private:
  // A data module (BasicDataModule<Batch>) or a loader; validate, test or
  // predict (predict_step's outputs into `outputs`).
  template <typename Batch, typename Loader>
  std::map<std::string, double> evaluate(detail::Stage stage, BasicModule<Batch>& model, Loader& loader,
                                         const EvalOptions& options, std::vector<torch::Tensor>* outputs = nullptr) {
    if constexpr (std::is_base_of_v<ModuleBase, Loader>) {
      detail::ModuleLoaderRunner<Batch> runner(model, model, stage);
      return run_eval(stage, model, runner, options, outputs);
    } else if constexpr (std::is_base_of_v<DataModuleBase, Loader>) {
      static_assert(std::is_base_of_v<BasicDataModule<Batch>, Loader>,
                    "the data module's batch type is not the module's: derive both from the same Batch");
      detail::DataModuleRunner<Batch> runner(model, loader, stage);
      return run_eval(stage, model, runner, options, outputs, &loader);
    } else {
      auto runner = detail::make_runner(model, loader);
      return run_eval(stage, model, runner, options, outputs);
    }
  }
  FitResult run_fit(ModuleBase& model, detail::StepRunner& train, detail::StepRunner* val, const FitOptions& options,
                    DataModuleBase* datamodule = nullptr);
  std::map<std::string, double> run_eval(detail::Stage stage, ModuleBase& model, detail::StepRunner& runner,
                                         const EvalOptions& options, std::vector<torch::Tensor>* outputs,
                                         DataModuleBase* datamodule = nullptr);

  // The tuner's sweeps run the fit loop inside a fit (src/tuner/).
  friend struct detail::TrainerAccess;
  std::unique_ptr<detail::TrainerState> state_;
};

}  // namespace fulgor
