#pragma once

#include <torch/data/example.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fulgor/core/batch.h"
#include "fulgor/core/export.h"
#include "fulgor/data/any_loader.h"
#include "fulgor/optim/manual_optimizer.h"
#include "fulgor/optim/scheduler.h"
#include "fulgor/optim/zero_grad.h"

namespace fulgor {

class Trainer;
class Callback;
namespace metrics {
class Metric;
}

/// How log() reduces a metric's values over an epoch.
enum class Reduce { mean, sum, max, min };

/// Options of Module::log, with Lightning's meanings. on_step and on_epoch
/// default per hook as in Lightning: in training_step and the training batch
/// hooks on_step=true, on_epoch=false; in validation_step, test_step and the
/// epoch hooks on_step=false, on_epoch=true. A metric logged with both is
/// reported as `<name>_step` and `<name>_epoch`.
struct LogOptions {
  bool prog_bar = false;  ///< show on the progress bar
  std::optional<bool> on_step;
  std::optional<bool> on_epoch;
  Reduce reduce = Reduce::mean;  ///< epoch reduction; mean is weighted by batch size
  bool logger = true;            ///< send to the loggers
  /// The weight of this value in the epoch mean (default: the batch's size).
  std::optional<int64_t> batch_size;
  /// Under strategy "ddp": combine the value over the ranks with `reduce`
  /// (mean, sum, max or min) when it is logged, so every rank records the same
  /// number. Every rank must then log it the same number of times.
  bool sync_dist = false;
};

namespace detail {
// Where log() goes while a Trainer runs the module.
class MetricSink {
 public:
  virtual ~MetricSink() = default;
  virtual void log(std::string_view name, double value, const LogOptions& options) = 0;
  // A one-element tensor on a device, read when its value is needed rather
  // than now (Note [Deferred reads] in src/loops/metric_store.h).
  virtual void log_on_device(std::string_view name, const torch::Tensor& value, const LogOptions& options) = 0;
  // A metrics::Metric, computed when the epoch ends (Note [Logged metric
  // objects] in src/loops/metric_store.h).
  virtual void log_metric(std::string_view name, metrics::Metric& metric, const LogOptions& options) = 0;
};
struct ModuleAccess;
template <typename Batch>
class LoaderRunner;
}  // namespace detail

/// What ModuleBase::optimizer_step is given to step the optimizer with:
/// calling it does what `optimizer.step(closure=optimizer_closure)` does in
/// Lightning's optimizer_step. It runs the closure (training_step, on the
/// first batch of an accumulation window on_before_zero_grad and
/// optimizer_zero_grad, then backward with its hooks), then
/// on_before_optimizer_step, configure_gradient_clipping and the optimizer's
/// step (through the "16-mixed" loss scaler, which may skip it). Call it once.
class OptimizerClosure {
 public:
  virtual void operator()() = 0;

 protected:
  ~OptimizerClosure() = default;
};

class ModuleBase;

/// Lightning's toggled_optimizer: while it lives, only `optimizer`'s
/// parameters require gradients (ModuleBase::toggle_optimizer); it untoggles
/// when it goes out of scope, also on exceptions.
class [[nodiscard]] ToggledOptimizer {
 public:
  // Exported member by member: GCC takes no attribute between [[nodiscard]] and the name.
  FULGOR_API ToggledOptimizer(ModuleBase& module, torch::optim::Optimizer& optimizer);
  FULGOR_API ~ToggledOptimizer();
  ToggledOptimizer(const ToggledOptimizer&) = delete;
  ToggledOptimizer& operator=(const ToggledOptimizer&) = delete;

 private:
  ModuleBase& module_;
  torch::optim::Optimizer& optimizer_;
};

/// The part of a module that does not depend on the batch type: hooks,
/// logging, hyper-parameters, optimizers. Derive from BasicModule<Batch> (or
/// Module) rather than from this class.
///
/// Contract: the Trainer calls configure_optimizers() once per fit after
/// moving the module onto the device, and the hooks in Lightning's order
/// (docs/training.md, "Hook order"). Every hook has a no-op default, and
/// the hooks that do the Trainer's work (optimizer_step, optimizer_zero_grad,
/// configure_gradient_clipping, lr_scheduler_step) do it by default. log() may
/// only be called while a Trainer runs the module (it throws Error otherwise).
///
/// Optimization is automatic by default: the Trainer steps the one optimizer
/// with each training_step's loss. A module that calls
/// set_automatic_optimization(false) (in its constructor) optimizes in
/// training_step itself, with optimizers(), manual_backward() and
/// ManualOptimizer::step(), and may configure several optimizers
/// (docs/training.md, "Manual optimization").
class FULGOR_API ModuleBase : public torch::nn::Module {
 public:
  ModuleBase() = default;
  explicit ModuleBase(const std::string& name) : torch::nn::Module(name) {}

  /// The optimizer(s) and optional schedulers to train with.
  virtual OptimizerConfig configure_optimizers() = 0;

  /// Callbacks this module brings along, merged into the Trainer's when a
  /// loop starts (Lightning's configure_callbacks): they replace the
  /// Trainer's callbacks of the same type, and ModelCheckpoints go last.
  virtual std::vector<std::shared_ptr<Callback>> configure_callbacks() { return {}; }

  // ---- Hooks, in the order the Trainer calls them ---------------------------
  /// Work to do once per node before any process's setup (downloading data):
  /// the Trainer calls it on each node's local rank 0, or on the job's rank 0
  /// alone when prepare_data_per_node() is false; the other processes wait.
  virtual void prepare_data() {}
  virtual bool prepare_data_per_node() const { return true; }
  /// `stage` is "fit", "validate", "test" or "predict".
  virtual void setup(const std::string& /*stage*/) {}
  virtual void teardown(const std::string& /*stage*/) {}
  /// Builds layers that should be made only once the module runs (Lightning's
  /// configure_model): called after setup, before a checkpoint's weights are
  /// loaded and configure_optimizers; what it makes is then moved onto the
  /// device and into the precision. Called at every loop: make layers once.
  virtual void configure_model() {}
  virtual void on_fit_start() {}
  virtual void on_train_start() {}
  virtual void on_train_epoch_start() {}
  /// Returning -1 skips the rest of the epoch (this batch included).
  virtual int on_train_batch_start(int64_t /*batch_idx*/) { return 0; }
  virtual void on_before_zero_grad(torch::optim::Optimizer& /*optimizer*/) {}
  /// Sets the gradients to none (fulgor::zero_grad), as PyTorch 2's
  /// optimizer.zero_grad() and Lightning do.
  virtual void optimizer_zero_grad(int64_t /*epoch*/, int64_t /*batch_idx*/, torch::optim::Optimizer& optimizer) {
    fulgor::zero_grad(optimizer);
  }
  virtual void on_before_backward(const torch::Tensor& /*loss*/) {}
  /// Runs the backward pass from `loss` (scaled under "16-mixed"), for
  /// training_step's loss and for manual_backward; override to change how.
  virtual void backward(const torch::Tensor& loss) { loss.backward(); }
  virtual void on_after_backward() {}
  virtual void on_before_optimizer_step(torch::optim::Optimizer& /*optimizer*/) {}
  /// Steps the optimizer at the end of an accumulation window; override to
  /// change the step (a learning-rate warm-up), calling `optimizer_closure()`
  /// where Lightning's code calls `optimizer.step(closure=optimizer_closure)`.
  virtual void optimizer_step(int64_t /*epoch*/, int64_t /*batch_idx*/, torch::optim::Optimizer& /*optimizer*/,
                              OptimizerClosure& optimizer_closure) {
    optimizer_closure();
  }
  /// Clips the gradients before the optimizer steps; `clip_val` and
  /// `algorithm` are the Trainer's gradient_clip_val and
  /// gradient_clip_algorithm.
  virtual void configure_gradient_clipping(torch::optim::Optimizer& optimizer, std::optional<double> clip_val,
                                           const std::string& algorithm) {
    clip_gradients(optimizer, clip_val, algorithm);
  }
  /// Steps a scheduler when its interval comes; `metric` is its monitored value.
  virtual void lr_scheduler_step(LRScheduler& scheduler, std::optional<double> metric) { scheduler.step(metric); }
  /// `loss`: training_step's loss without its autograd graph.
  virtual void on_train_batch_end(const torch::Tensor& /*loss*/, int64_t /*batch_idx*/) {}
  virtual void on_train_epoch_end() {}
  virtual void on_train_end() {}
  virtual void on_fit_end() {}
  /// Before fit validates after a batch that stepped the optimizer: frees the
  /// gradients, which validation does not need.
  virtual void on_validation_model_zero_grad() { zero_grad(/*set_to_none=*/true); }
  /// As a validation (or test, or predict) loop begins: puts the module in
  /// evaluation mode. The `_train` hooks, as it ends, put back the mode the
  /// module had before (mode_before_evaluation()).
  virtual void on_validation_model_eval() { eval(); }
  virtual void on_validation_model_train() { train(mode_before_evaluation()); }
  virtual void on_validation_start() {}
  virtual void on_validation_epoch_start() {}
  virtual void on_validation_batch_start(int64_t /*batch_idx*/) {}
  virtual void on_validation_batch_end(int64_t /*batch_idx*/) {}
  virtual void on_validation_epoch_end() {}
  virtual void on_validation_end() {}
  virtual void on_test_model_eval() { eval(); }
  virtual void on_test_model_train() { train(mode_before_evaluation()); }
  virtual void on_test_start() {}
  virtual void on_test_epoch_start() {}
  virtual void on_test_batch_start(int64_t /*batch_idx*/) {}
  virtual void on_test_batch_end(int64_t /*batch_idx*/) {}
  virtual void on_test_epoch_end() {}
  virtual void on_test_end() {}
  virtual void on_predict_model_eval() { eval(); }
  virtual void on_predict_start() {}
  virtual void on_predict_epoch_start() {}
  virtual void on_predict_batch_start(int64_t /*batch_idx*/) {}
  /// `prediction`: what predict_step returned for the batch.
  virtual void on_predict_batch_end(const torch::Tensor& /*prediction*/, int64_t /*batch_idx*/) {}
  virtual void on_predict_epoch_end() {}
  virtual void on_predict_end() {}
  /// Adds module-specific state to a checkpoint being saved / reads it back.
  virtual void on_save_checkpoint(nlohmann::json& /*state*/) {}
  virtual void on_load_checkpoint(const nlohmann::json& /*state*/) {}

  /// Clips the gradients of `optimizer`'s parameters: their total 2-norm
  /// (algorithm "norm") or each element ("value") to `clip_val`; nothing
  /// when clip_val is unset or 0. Throws ConfigError for another algorithm.
  /// Under a sharded strategy the norm is that of the whole gradient, over
  /// the ranks' shards.
  void clip_gradients(torch::optim::Optimizer& optimizer, std::optional<double> clip_val,
                      const std::string& algorithm = "norm");

  // ---- Logging --------------------------------------------------------------
  /// Records a metric (see LogOptions). A tensor must hold one element; one
  /// on a device is read when the value is needed (when logs are due, a
  /// callback asks for the metrics, or the epoch ends), not at every call.
  void log(std::string_view name, const torch::Tensor& value, const LogOptions& options = {});
  void log(std::string_view name, double value, const LogOptions& options = {});
  /// Logs a metrics::Metric as Lightning logs a torchmetrics Metric. on_epoch:
  /// its compute() at the end of the epoch (over every rank under strategy
  /// "ddp"), after which it is reset; on_step: the value of the batch the
  /// last forward() (or call) gave it, so a metric logged on_step is updated
  /// with forward(), not update(). `reduce`, `batch_size` and `sync_dist` do
  /// not apply. The metric must outlive the epoch, and under ddp every rank
  /// logs the same metrics. Throws ConfigError when the value has more than
  /// one element.
  void log(std::string_view name, metrics::Metric& metric, const LogOptions& options = {});
  void log_dict(const std::map<std::string, double>& values, const LogOptions& options = {});

  // ---- Manual optimization --------------------------------------------------
  /// Whether the Trainer optimizes (true, the default) or training_step does.
  /// Read when fit begins.
  bool automatic_optimization() const { return automatic_optimization_; }
  void set_automatic_optimization(bool automatic) { automatic_optimization_ = automatic; }
  /// The optimizers configure_optimizers returned, in order. Throws Error
  /// when no fit is running the module.
  std::vector<ManualOptimizer>& optimizers();
  /// The schedulers configure_optimizers returned, in order; under manual
  /// optimization the Trainer does not step them: call step() on them.
  std::vector<std::shared_ptr<LRScheduler>> lr_schedulers() const;
  /// Backward from `loss` as the Trainer does it: the callbacks' and the
  /// module's on_before_backward and on_after_backward around it, the loss
  /// scaled under "16-mixed", gradients averaged over the ranks under "ddp".
  /// Throws ConfigError under automatic optimization.
  void manual_backward(const torch::Tensor& loss);
  /// Makes only `optimizer`'s parameters require gradients, recording what
  /// every optimizer's parameters required (Lightning's toggle_optimizer), so
  /// that a backward pass for one part of a model (a GAN's generator) leaves
  /// the others' gradients alone. untoggle_optimizer puts the other
  /// optimizers' parameters back.
  void toggle_optimizer(torch::optim::Optimizer& optimizer);
  void toggle_optimizer(ManualOptimizer& optimizer) { toggle_optimizer(optimizer.optimizer()); }
  void untoggle_optimizer(torch::optim::Optimizer& optimizer);
  void untoggle_optimizer(ManualOptimizer& optimizer) { untoggle_optimizer(optimizer.optimizer()); }
  /// toggle_optimizer until the returned guard goes out of scope:
  /// `auto toggled = toggled_optimizer(opt);`.
  ToggledOptimizer toggled_optimizer(ManualOptimizer& optimizer) { return {*this, optimizer.optimizer()}; }

  // ---- Hyper-parameters -----------------------------------------------------
  /// Records hyper-parameters: saved in checkpoints and sent to the loggers.
  void save_hyperparameters(nlohmann::json hparams) { hparams_ = std::move(hparams); }
  const nlohmann::json& hparams() const { return hparams_; }

  /// The Trainer running this module; throws Error when none is.
  Trainer& trainer() const;

 protected:
  /// Whether the module was training when the running evaluation loop began
  /// (the default on_validation_model_train puts that mode back).
  bool mode_before_evaluation() const { return training_before_evaluation_; }

 private:
  friend struct detail::ModuleAccess;
  const OptimizerConfig& optim_config() const;

  detail::MetricSink* sink_ = nullptr;
  Trainer* trainer_ = nullptr;
  // The attached Trainer's optimizers and schedulers (its configure_optimizers).
  const OptimizerConfig* optim_ = nullptr;
  bool automatic_optimization_ = true;
  bool training_before_evaluation_ = true;
  // Set under a sharded strategy: the norm over the ranks of the gradients of
  // shards (an optimizer's parameters).
  std::function<double(const std::vector<torch::Tensor>&)> sharded_gradient_norm_;
  // Set while a fit runs it: the ManualOptimizers handed out, and what they step with.
  detail::ManualSteps* manual_steps_ = nullptr;
  std::vector<ManualOptimizer> manual_optimizers_;
  // toggle_optimizer's record: each parameter and whether it required grad.
  std::vector<std::pair<torch::Tensor, bool>> toggled_;
  nlohmann::json hparams_ = nlohmann::json::object();
};

namespace impl {
[[noreturn]] FULGOR_API void throw_step_not_implemented(const ModuleBase& module, const char* step);
}

/// A LightningModule for batches of type `Batch` (what the loaders yield).
/// `Module` is the common case: batches of torch::data::Example<>, which a
/// LibTorch data loader with Stack<> collation yields.
///
///   struct LitClassifier : fulgor::Module {
///     torch::Tensor training_step(torch::data::Example<> batch, int64_t batch_idx) override;
///     void validation_step(torch::data::Example<> batch, int64_t batch_idx) override;
///     fulgor::OptimizerConfig configure_optimizers() override;
///   };
///
/// Contract: training_step returns a scalar loss that requires grad (an
/// undefined tensor skips the batch). The other steps have defaults that throw
/// ConfigError: a loop given a loader for them needs them overridden.
template <typename Batch = torch::data::Example<>>
class BasicModule : public ModuleBase {
 public:
  using BatchType = Batch;
  using ModuleBase::ModuleBase;

  virtual torch::Tensor training_step(Batch batch, int64_t batch_idx) = 0;
  virtual void validation_step(Batch /*batch*/, int64_t /*batch_idx*/) {
    impl::throw_step_not_implemented(*this, "validation_step");
  }
  virtual void test_step(Batch /*batch*/, int64_t /*batch_idx*/) {
    impl::throw_step_not_implemented(*this, "test_step");
  }
  virtual torch::Tensor predict_step(Batch /*batch*/, int64_t /*batch_idx*/) {
    impl::throw_step_not_implemented(*this, "predict_step");
  }

  // ---- Batch transfer, in this order, for every batch a loop runs ----------
  // (dataloader_idx is 0: a loop has one loader)
  virtual Batch on_before_batch_transfer(Batch batch, int64_t /*dataloader_idx*/) { return batch; }
  /// Moves the batch onto the Trainer's device (move_batch, through the
  /// accelerator); a batch the loader made there already is left as it is.
  virtual Batch transfer_batch_to_device(Batch batch, torch::Device device, int64_t /*dataloader_idx*/) {
    if (transfer_accelerator_ == nullptr || !transfer_moves_) return batch;
    return move_batch(std::move(batch), *transfer_accelerator_, device);
  }
  virtual Batch on_after_batch_transfer(Batch batch, int64_t /*dataloader_idx*/) { return batch; }

  // ---- The module's own loaders (Lightning's train_dataloader() and others) --
  /// What trainer.fit(model), validate(model), test(model) and predict(model)
  /// run on when given no loader and no data module; each is asked for when
  /// its loop sets up its data. A data module's loaders take their place.
  virtual AnyLoader<Batch> train_loader() { return {}; }
  virtual AnyLoader<Batch> val_loader() { return {}; }
  virtual AnyLoader<Batch> test_loader() { return {}; }
  virtual AnyLoader<Batch> predict_loader() { return {}; }

 private:
  template <typename>
  friend class detail::LoaderRunner;
  // Set by the Trainer's loader for transfer_batch_to_device's default.
  const Accelerator* transfer_accelerator_ = nullptr;
  bool transfer_moves_ = true;
};

using Module = BasicModule<torch::data::Example<>>;

}  // namespace fulgor
