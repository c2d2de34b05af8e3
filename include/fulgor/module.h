#pragma once

#include <torch/data/example.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "fulgor/scheduler.h"

namespace fulgor {

class Trainer;

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
};
struct ModuleAccess;
}  // namespace detail

/// The part of a module that does not depend on the batch type: hooks,
/// logging, hyper-parameters, optimizers. Derive from BasicModule<Batch> (or
/// Module) rather than from this class.
///
/// Contract: the Trainer calls configure_optimizers() once per fit after
/// moving the module onto the device, and the hooks in Lightning's order. Every
/// hook has a no-op default. log() may only be called while a Trainer runs the
/// module (it throws Error otherwise).
class ModuleBase : public torch::nn::Module {
 public:
  ModuleBase() = default;
  explicit ModuleBase(const std::string& name) : torch::nn::Module(name) {}

  /// The optimizer(s) and optional schedulers to train with.
  virtual OptimizerConfig configure_optimizers() = 0;

  // ---- Hooks, in the order the Trainer calls them ---------------------------
  virtual void on_fit_start() {}
  virtual void on_train_start() {}
  virtual void on_train_epoch_start() {}
  virtual void on_train_batch_start(int64_t /*batch_idx*/) {}
  virtual void on_before_backward(const torch::Tensor& /*loss*/) {}
  virtual void on_after_backward() {}
  virtual void on_before_optimizer_step(torch::optim::Optimizer& /*optimizer*/) {}
  virtual void on_before_zero_grad(torch::optim::Optimizer& /*optimizer*/) {}
  /// `loss`: training_step's loss without its autograd graph.
  virtual void on_train_batch_end(const torch::Tensor& /*loss*/, int64_t /*batch_idx*/) {}
  virtual void on_train_epoch_end() {}
  virtual void on_train_end() {}
  virtual void on_fit_end() {}
  virtual void on_validation_epoch_start() {}
  virtual void on_validation_batch_end(int64_t /*batch_idx*/) {}
  virtual void on_validation_epoch_end() {}
  virtual void on_test_epoch_start() {}
  virtual void on_test_batch_end(int64_t /*batch_idx*/) {}
  virtual void on_test_epoch_end() {}
  virtual void on_predict_epoch_start() {}
  virtual void on_predict_epoch_end() {}
  /// Adds module-specific state to a checkpoint being saved / reads it back.
  virtual void on_save_checkpoint(nlohmann::json& /*state*/) {}
  virtual void on_load_checkpoint(const nlohmann::json& /*state*/) {}

  // ---- Logging --------------------------------------------------------------
  /// Records a metric (see LogOptions). A tensor must hold one element.
  void log(std::string_view name, const torch::Tensor& value, const LogOptions& options = {});
  void log(std::string_view name, double value, const LogOptions& options = {});
  void log_dict(const std::map<std::string, double>& values, const LogOptions& options = {});

  // ---- Hyper-parameters -----------------------------------------------------
  /// Records hyper-parameters: saved in checkpoints and sent to the loggers.
  void save_hyperparameters(nlohmann::json hparams) { hparams_ = std::move(hparams); }
  const nlohmann::json& hparams() const { return hparams_; }

  /// The Trainer running this module; throws Error when none is.
  Trainer& trainer() const;

 private:
  friend struct detail::ModuleAccess;
  detail::MetricSink* sink_ = nullptr;
  Trainer* trainer_ = nullptr;
  nlohmann::json hparams_ = nlohmann::json::object();
};

namespace detail {
[[noreturn]] void throw_step_not_implemented(const ModuleBase& module, const char* step);
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
    detail::throw_step_not_implemented(*this, "validation_step");
  }
  virtual void test_step(Batch /*batch*/, int64_t /*batch_idx*/) {
    detail::throw_step_not_implemented(*this, "test_step");
  }
  virtual torch::Tensor predict_step(Batch /*batch*/, int64_t /*batch_idx*/) {
    detail::throw_step_not_implemented(*this, "predict_step");
  }
};

using Module = BasicModule<torch::data::Example<>>;

}  // namespace fulgor
