#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "fulgor/callback.h"
#include "fulgor/core/export.h"

namespace fulgor {

/// How an averaged tensor takes in a model's: (averaged, current, number of
/// models averaged so far, at least 1) -> the new average, as
/// torch.optim.swa_utils' avg_fn.
using AverageFunction = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, int64_t)>;

/// torch.optim.swa_utils.get_swa_avg_fn: the equally weighted average,
/// a + (m - a) / (n + 1).
FULGOR_API AverageFunction swa_average();
/// torch.optim.swa_utils.get_ema_avg_fn: decay * a + (1 - decay) * m.
/// A decay outside [0, 1] is a ConfigError.
FULGOR_API AverageFunction ema_average(double decay = 0.999);

/// A running average of a module's parameters and buffers (torch's
/// AveragedModel): the first update copies the module's values, each later one
/// combines them with `average` (default: swa_average()).
///
/// Contract: holds one tensor per parameter, then per buffer, of the module it
/// was made from, in the order of parameters() and buffers(), on `device`
/// (default: where each of the module's tensors lives). With use_buffers the
/// buffers are averaged as the parameters; without, each update copies the
/// module's buffers (torch 2's behaviour). Tensors that are not floating
/// point (BatchNorm's num_batches_tracked) take the module's value at every
/// update: torch would average them and round. update/swap/copy refuse, with
/// a ConfigError, a module whose tensors differ in number or shape.
class FULGOR_API AveragedModel {
 public:
  AveragedModel(const torch::nn::Module& module, AverageFunction average = {}, bool use_buffers = true,
                std::optional<torch::Device> device = std::nullopt);

  /// torch's update_parameters(model).
  void update_parameters(const torch::nn::Module& module);
  /// Exchanges the averaged values with the module's.
  void swap(torch::nn::Module& module);
  /// Copies the averaged values into the module.
  void copy_to(torch::nn::Module& module) const;
  /// Takes the module's values as the average, keeping n_averaged.
  void copy_from(const torch::nn::Module& module);

  int64_t n_averaged() const { return n_averaged_; }
  void set_n_averaged(int64_t n) { n_averaged_ = n; }
  /// The averaged parameters, then buffers.
  const std::vector<torch::Tensor>& tensors() const { return tensors_; }

 private:
  std::vector<torch::Tensor> module_tensors(const torch::nn::Module& module, const char* what) const;

  std::vector<torch::Tensor> tensors_;
  size_t n_parameters_ = 0;
  AverageFunction average_;
  bool use_buffers_;
  int64_t n_averaged_ = 0;
};

/// Options of WeightAveraging.
struct WeightAveragingOptions {
  /// Where the averaged model lives; default: the module's device.
  std::optional<torch::Device> device;
  bool use_buffers = true;  ///< average the buffers too (Lightning's default, unlike torch's)
  AverageFunction average;  ///< default: swa_average()
};

/// Keeps an averaged copy of the module while it trains (Lightning 2.6's
/// WeightAveraging): updated after an optimizer step when should_update
/// (step_idx = global_step - 1) says so, and after an epoch when
/// should_update (epoch_idx) does. Override should_update to choose when; the
/// default updates after every optimizer step.
///
/// Contract, as Lightning's: the averaged copy is made when fit sets up (from
/// the module's weights when the fit starts or resumes). Validation runs on
/// the averaged weights (swapped in at on_validation_epoch_start, out at
/// on_validation_epoch_end; validate() after fit runs on the module's weights
/// as they are), and when training ends the module keeps the
/// averaged weights. A checkpoint saved during fit holds the averaged weights
/// as its model (what load_module_weights and other programs read) and the
/// module's own as this callback's tensors; resuming from it restores both,
/// with the number of models averaged and the last step that updated. Resuming
/// from a checkpoint without them starts the average from its model.
class FULGOR_API WeightAveraging : public Callback {
 public:
  explicit WeightAveraging(WeightAveragingOptions options = {});

  /// Whether to update after optimizer step `step_idx` or epoch `epoch_idx`
  /// (zero-based; exactly one is given).
  virtual bool should_update(std::optional<int64_t> step_idx, std::optional<int64_t> epoch_idx);

  /// The averaged model, once fit has started.
  const AveragedModel* average_model() const { return average_ ? &*average_ : nullptr; }

  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;
  bool save_tensors(Trainer& trainer, ModuleBase& module, torch::serialize::OutputArchive& archive) override;
  void load_tensors(Trainer& trainer, ModuleBase& module, torch::serialize::InputArchive& archive) override;
  void swap_checkpoint_weights(ModuleBase& module) override;

  void setup(Trainer& trainer, ModuleBase& module, const std::string& stage) override;
  void on_fit_start(Trainer& trainer, ModuleBase& module) override;
  void on_train_batch_end(Trainer& trainer, ModuleBase& module, const torch::Tensor& loss, int64_t batch_idx) override;
  void on_train_epoch_end(Trainer& trainer, ModuleBase& module) override;
  void on_train_end(Trainer& trainer, ModuleBase& module) override;
  void on_validation_epoch_start(Trainer& trainer, ModuleBase& module) override;
  void on_validation_epoch_end(Trainer& trainer, ModuleBase& module) override;

 private:
  void make_average(const ModuleBase& module);

  WeightAveragingOptions options_;
  std::optional<AveragedModel> average_;
  int64_t latest_update_step_ = 0;
  int64_t latest_update_epoch_ = -1;
  bool fitting_ = false;
};

/// Options of EMAWeightAveraging, with Lightning's defaults.
struct EMAWeightAveragingOptions {
  std::optional<torch::Device> device;
  bool use_buffers = true;
  double decay = 0.999;
  int64_t update_every_n_steps = 1;  ///< steps whose index is a multiple of this; 0: none
  std::optional<int64_t> update_starting_at_step;
  std::optional<int64_t> update_starting_at_epoch;  ///< also after each epoch from this one on
};

/// The exponential moving average of the weights (Lightning 2.6's
/// EMAWeightAveraging): WeightAveraging with ema_average(decay), updated
/// after every update_every_n_steps-th optimizer step from
/// update_starting_at_step on, and after every epoch from
/// update_starting_at_epoch on.
class FULGOR_API EMAWeightAveraging : public WeightAveraging {
 public:
  explicit EMAWeightAveraging(EMAWeightAveragingOptions options = {});
  bool should_update(std::optional<int64_t> step_idx, std::optional<int64_t> epoch_idx) override;

 private:
  EMAWeightAveragingOptions ema_;
};

}  // namespace fulgor
